"""`speckv simulate --sweep` end to end on a tiny synthetic slice: two
cells (links) x two policies on the process pool; the JSON's regime_map
holds every cell and policy with the map's figures, and the report holds the
heat map. Then the map's own rules on figures made by hand: the gain, the
winner among non-oracle policies, and a cell where the oracle does not pay."""
from __future__ import annotations

import json

import pytest

from speckv.loadgen.experiments.regime_map import MapCell, RegimeMap, cell_verdict, gain, markdown
from speckv.loadgen.experiments.results import PolicySummary
from speckv.loadgen.sim import cli
from speckv.services.common.errors import InvalidArgument

FIGURES = {"returning_ttft_p99_ms", "first_seen_ttft_p99_ms", "burst_ttft_p99_ms", "reuse_recovered_ratio",
           "avoidable_closed", "burst_gain", "returning_gain"}


def test_a_two_cell_sweep_writes_every_cell_and_policy_and_the_heat_map(tmp_path):
    out, report = tmp_path / "map.json", tmp_path / "report"
    code = cli.main(["--synthetic", "document-bursts", "--nodes", "4", "--start-s", "600", "--duration-s", "20",
                     "--policies", "none,oracle", "--sweep", "link=tcp-25g,rdma-400g", "--jobs", "2",
                     "--compiled", "off", "--json", str(out), "--report", str(report)], {})
    assert code == 0
    result = json.loads(out.read_text())
    regime = result["regime_map"]
    assert regime["links"] == ["tcp-25g", "rdma-400g"] and regime["profiles"] == ["llama-3-8b-h100"]
    assert regime["headline_figure"] == "burst_ttft_p99_ms"
    cells = {(c["link"], c["profile"], c["nodes"]): c for c in regime["cells"]}
    assert set(cells) == {("tcp-25g", "llama-3-8b-h100", 4), ("rdma-400g", "llama-3-8b-h100", 4)}
    for cell in cells.values():
        assert set(cell["policies"]) == {"none", "oracle"}
        for figures in cell["policies"].values():
            assert FIGURES <= set(figures)
            assert figures["burst_ttft_p99_ms"] > 0
        assert cell["policies"]["none"]["burst_gain"] == 0.0
        assert cell["best"]["burst_ttft_p99_ms"] is None  # no policy here is neither none nor the oracle
        assert cell["oracle"]["burst_ttft_p99_ms"]["pays"] in (True, False)
    # Each cell ran on its own link, and says so.
    assert cells[("tcp-25g", "llama-3-8b-h100", 4)]["config"]["link"]["gbps_per_gpu"] == 25.0
    assert cells[("rdma-400g", "llama-3-8b-h100", 4)]["config"]["link"]["gbps_per_gpu"] == 190.0
    assert set(result["cells"]) == {"tcp-25g", "rdma-400g"}
    assert result["cells"]["rdma-400g"]["link_gbps"] == 190.0
    index = (report / "index.html").read_text()
    assert "regime map" in index and "data:image/png;base64," in index
    assert (report / "regime_map_4_burst_gain.png").stat().st_size > 0
    assert (report / "cells" / "tcp-25g" / "nodes-4" / "index.html").is_file()


def test_a_bad_sweep_fails_before_any_worker_starts(tmp_path):
    with pytest.raises(InvalidArgument, match="unknown 'fiber-9t'"):
        cli.main(["--synthetic", "document-bursts", "--sweep", "link=tcp-25g,fiber-9t", "--compiled", "off"], {})
    with pytest.raises(InvalidArgument, match="unknown key 'gpu'"):
        cli.main(["--synthetic", "document-bursts", "--sweep", "gpu=h100"], {})


def summary(burst: float, returning: float) -> PolicySummary:
    figures = {name: None for name in PolicySummary.__dataclass_fields__}
    figures.update(requests=1, served=1, errors=0, retried=0, burst_requests=1, prefix_hit_ratio=0.0,
                   fetched_requests=0, bytes_replicated=0, replica_blocks_committed=0, replica_blocks_read=0,
                   replica_hit_ratio=0.0, wasted_bytes_ratio=0.0, replica_landings=0,
                   replica_landings_read_ratio=0.0, orders={}, burst_ttft_p99_ms=burst, returning_ttft_p99_ms=returning)
    return PolicySummary(**figures)


def cell(link: str, policies: dict[str, PolicySummary]) -> MapCell:
    return MapCell(link, link, "p", 8, {}, policies, None)


def test_the_winner_is_the_best_non_oracle_policy_and_a_flat_oracle_does_not_pay():
    pays = cell("slow", {"none": summary(1000, 500), "reactive-heat": summary(950, 500),
                         "predictive": summary(900, 400), "oracle": summary(500, 300),
                         "oracle-without-retain": summary(100, 100)})
    assert gain(pays.policies, "predictive", "burst_ttft_p99_ms") == pytest.approx(0.1)
    assert pays.best("burst_ttft_p99_ms") == ("predictive", pytest.approx(0.1))
    assert pays.oracle_gain("burst_ttft_p99_ms") == pytest.approx(0.5) and pays.oracle_pays("burst_ttft_p99_ms")
    assert cell_verdict(pays) == "predictive +10.0 %; oracle +50.0 %"
    flat = cell("fast", {"none": summary(1000, 500), "predictive": summary(1010, 500), "oracle": summary(995, 500)})
    assert flat.best("burst_ttft_p99_ms") == ("predictive", pytest.approx(-0.01))
    assert flat.oracle_pays("burst_ttft_p99_ms") is False
    # A best candidate that does not beat none is named as such: a tie is no win.
    assert cell_verdict(flat) == "none wins (best other -1.0 %); oracle +0.5 % (oracle does not pay)"
    table = markdown(RegimeMap({"link": ["slow", "fast"]}, ["slow", "fast"], ["p"], [pays, flat]))
    assert "| fast | none wins (best other -1.0 %); oracle +0.5 % (oracle does not pay) |" in table
    assert "| slow | predictive +10.0 %; oracle +50.0 % |" in table
