"""`speckv simulate` gives every policy's request statistics a bootstrap
interval (as the demo and `bench e2e` do), holding the figure, every policy
but `none` the paired interval of its difference from `none`'s, holding
that difference, and its console says burst p99 against `none`'s with "tie"
where that interval holds 0."""
from __future__ import annotations

import json
from dataclasses import replace

from speckv.loadgen.experiments.bootstrap import INTERVAL_FIGURES
from speckv.loadgen.experiments.metrics import RequestRecord, summarize
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger
from speckv.loadgen.experiments.report import is_tie
from speckv.loadgen.experiments.results import PolicySummary
from speckv.loadgen.sim import cli
from speckv.loadgen.sim.comparison import _verdict_cell


def test_simulate_writes_intervals_that_hold_each_figure_and_prints_the_verdict(tmp_path, capsys):
    out = tmp_path / "sim.json"
    code = cli.main(["--synthetic", "document-bursts", "--nodes", "4", "--start-s", "600", "--duration-s", "20",
                     "--policies", "none,oracle", "--jobs", "1", "--compiled", "off", "--json", str(out)], {})
    assert code == 0
    policies = json.loads(out.read_text())["policies"]
    for name, row in policies.items():
        for key in INTERVAL_FIGURES:
            if row.get(key) is None:
                continue
            low, high = row["ci95"][key]
            assert low <= row[key] <= high, (name, key)
            if name == "none":
                assert "ci95_vs_none" not in row
            elif policies["none"].get(key) is not None:
                low, high = row["ci95_vs_none"][key]
                assert low <= row[key] - policies["none"][key] <= high, (name, key)
    printed = capsys.readouterr().out
    rows: dict[str, list[str]] = {}
    for line in printed.splitlines():
        if line.startswith("│ "):
            rows.setdefault(line.split("│")[1].strip(), []).append(line)
    assert any("baseline" in line for line in rows["none"])
    assert any(word in line for line in rows["oracle"] for word in ("tie", "better", "worse"))
    assert "what each simulation cost" in printed


def _summary(burst_p99: float, interval: tuple[float, float]) -> PolicySummary:
    records = [RequestRecord(f"r{i}", 10.5, "f", 1000, 10, "node-0", ttft_ms=burst_p99) for i in range(5)]
    s = summarize(records, frozenset({10}), 2000.0, ReplicaLedger().totals(), 64, {})
    return replace(s, ci95={"burst_ttft_p99_ms": interval})


def test_the_verdict_cell_calls_overlapping_intervals_a_tie_and_names_the_baseline():
    none = _summary(378.0, (343.0, 406.0))
    overlapping, apart = _summary(397.0, (345.0, 447.0)), _summary(200.0, (180.0, 220.0))
    assert is_tie(overlapping, none, "burst_ttft_p99_ms")
    assert _verdict_cell("predictive", overlapping, none) == "+5%, tie"
    assert _verdict_cell("oracle", apart, none) == "-47%, better"
    assert _verdict_cell("none", none, none) == "baseline"
    assert _verdict_cell("oracle", apart, None) == "-"
