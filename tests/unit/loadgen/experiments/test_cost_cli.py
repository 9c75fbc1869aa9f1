from __future__ import annotations

import json

import pytest

from speckv.loadgen.experiments import cost_cli
from speckv.services.common.cost_table import CostTable
from speckv.services.common.disks import get_disk
from speckv.services.common.engine_profile import LinkModel, get_profile
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.links import SOURCED_FIELDS, get_link


def scripted(tmp_path):
    """A profile and a link simple enough to price by hand: 256 B of KV per
    token, recompute 0.02 ms a token + 1e-6 ms a pair + 2 ms, pull 0.01 ms a
    token (2,048 bits / 0.2048 Gbit/s) + 1 ms."""
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"profiles": {"scripted": {
        "model": "m", "overhead_ms": 2.0, "ms_per_token": 0.02, "ms_per_token_pair": 1e-6, "source": "by hand",
        "geometry": {"num_layers": 1, "num_kv_heads": 1, "head_dim": 64, "dtype": "float16", "block_size": 16}}}}))
    links = tmp_path / "links.json"
    links.write_text(json.dumps({"links": {"wire": {
        "line_gbps": 0.4096, "effective_fraction": 0.5, "overhead_ms": 1.0,
        "sources": {key: "by hand" for key in SOURCED_FIELDS}}}}))
    return ["--profiles", str(profiles), "--links", str(links)]


def test_crossovers_match_the_hand_computed_ones(tmp_path, capsys):
    out = tmp_path / "cost.json"
    args = ["--profile", "scripted", "--link", "wire", "--host-link-gbps", "0", "--json", str(out)]
    assert cost_cli.main(args + scripted(tmp_path), {}) == 0
    figures = json.loads(out.read_text())
    # recompute - pull = (0.02 - 0.01)(P - 1) + 1e-6 P (P - 1) / 2 - 1 < 0: P = 100 gives
    # 99 x 0.01005 = 0.995, P = 101 gives 100 x 0.0100505 = 1.005.
    assert figures["recompute_beats_pull_tokens"] == [1, 100]
    assert figures["ms_per_token"] == {"recompute": 0.02, "pull": pytest.approx(0.01)}
    assert figures["host_link"] is None and figures["recompute_beats_promote_tokens"] is None
    assert figures["cheapest_peer_only"] == [{"path": "recompute", "tokens": [1, 100]},
                                             {"path": "pull", "tokens": [101, 131072]}]
    text = capsys.readouterr().out
    assert "recompute beats pull for prompts of 1 to 100 tokens" in text


def test_the_committed_profile_and_links_print_a_table_and_json(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert cost_cli.main(["--profile", "llama-3-8b-h100-vidur", "--link", "tcp-25g", "--json", str(out)], {}) == 0
    figures = json.loads(out.read_text())
    assert set(figures["ms_per_token"]) == {"recompute", "promote", "load", "pull"}  # --disk: nvme-gen4
    # 128 KiB a token over 25 Gbit/s.
    assert figures["ms_per_token"]["pull"] == pytest.approx(131072 * 8 / 25e9 * 1e3)
    table = CostTable(get_profile("llama-3-8b-h100-vidur"), get_link("tcp-25g").model())
    low, high = figures["recompute_beats_pull_tokens"]
    assert (low, high) == table.beats("recompute", "pull")
    assert table.cost_ms("recompute", high) < table.cost_ms("pull", high)
    assert table.cost_ms("recompute", high + 1) >= table.cost_ms("pull", high + 1)
    assert figures["host_link"] == {"gbps": 400.0, "overhead_ms": 0.05}  # the committed cluster's
    text = capsys.readouterr().out
    assert "recompute beats pull" in text and "cheapest" in text and "131,072" in text


def test_a_tensor_parallel_engine_moves_kv_over_all_its_gpus_links(tmp_path):
    out = tmp_path / "cost.json"
    cost_cli.main(["--profile", "llama-2-70b-h100-tp4-vidur", "--link", "tcp-25g", "--json", str(out)], {})
    figures = json.loads(out.read_text())
    assert figures["link"]["gbps"] == 100.0 and figures["host_link"]["gbps"] == 1600.0
    # 80 layers x 8 KV heads x 128 x 2 x 2 B = 320 KiB a token over 4 x 25 Gbit/s.
    assert figures["ms_per_token"]["pull"] == pytest.approx(327680 * 8 / 100e9 * 1e3)


def test_unknown_names_are_clear_errors():
    with pytest.raises(InvalidArgument, match="link='nope' is unknown"):
        cost_cli.main(["--profile", "llama-3-8b-h100-vidur", "--link", "nope"], {})
    with pytest.raises(InvalidArgument, match="engine_profile='nope' is unknown"):
        cost_cli.main(["--profile", "nope", "--link", "tcp-25g"], {})


def test_every_disk_profile_says_where_its_load_beats_recompute_and_the_pull(tmp_path, capsys):
    out = tmp_path / "cost.json"
    assert cost_cli.main(["--profile", "llama-3-8b-h100-vidur", "--link", "tcp-25g", "--json", str(out)], {}) == 0
    figures = json.loads(out.read_text())
    loads = {row["disk"]: row for row in figures["disk_loads"]}
    assert {"nvme-gen4", "nvme-gen5", "this-vm"} <= set(loads) and loads["this-vm"]["measured"]
    profile = get_profile("llama-3-8b-h100-vidur")
    host = LinkModel(figures["host_link"]["gbps"], figures["host_link"]["overhead_ms"])
    for name, row in loads.items():
        table = CostTable(profile, get_link("tcp-25g").model(), host, get_disk(name).model())
        first = row["load_beats_recompute_tokens"][0]
        assert table.cost_ms("load", first) < table.cost_ms("recompute", first)
        assert first == 1 or table.cost_ms("load", first - 1) >= table.cost_ms("recompute", first - 1)
        assert _range(table.beats("load", "pull")) == row["load_beats_pull_tokens"]
    # A faster drive starts beating recompute at a shorter prompt.
    assert (loads["nvme-gen5"]["load_beats_recompute_tokens"][0]
            < loads["nvme-gen4"]["load_beats_recompute_tokens"][0]
            < loads["this-vm"]["load_beats_recompute_tokens"][0])
    text = capsys.readouterr().out
    assert "recompute beats load (nvme-gen4)" in text and "this-vm *" in text and "on this node's disk" in text


def test_disk_none_leaves_the_load_path_out(tmp_path):
    out = tmp_path / "cost.json"
    cost_cli.main(["--profile", "llama-3-8b-h100-vidur", "--link", "tcp-25g", "--disk", "none", "--json", str(out)], {})
    figures = json.loads(out.read_text())
    assert set(figures["ms_per_token"]) == {"recompute", "promote", "pull"} and figures["cheapest_disk"] is None


def _range(found):
    return None if found is None else [found[0], found[1]]
