"""`speckv simulate --seeds`: every policy runs on each realization of a
synthetic scenario; the tables and JSON figures are the first seed's, each
figure's per-seed values ride in `repeats`, and the console prints them and
the between-seeds table. Bad --seeds fail before any worker starts."""
from __future__ import annotations

import json

import pytest

from speckv.loadgen.sim import cli
from speckv.services.common.errors import InvalidArgument

SLICE = ["--nodes", "4", "--start-s", "600", "--duration-s", "20", "--policies", "none,oracle", "--jobs", "2",
         "--compiled", "off"]


def test_each_seed_runs_and_the_first_is_the_one_the_tables_show(tmp_path, capsys):
    out, first = tmp_path / "seeds.json", tmp_path / "first.json"
    assert cli.main(["--synthetic", "document-bursts", *SLICE, "--seeds", "7,11", "--json", str(out)], {}) == 0
    printed = capsys.readouterr().out
    assert cli.main(["--synthetic", "document-bursts", *SLICE, "--seed", "7", "--json", str(first)], {}) == 0
    seeds, alone = json.loads(out.read_text())["policies"], json.loads(first.read_text())["policies"]
    for policy in ("none", "oracle"):
        assert seeds[policy]["ttft_p50_ms"] == alone[policy]["ttft_p50_ms"]
        p50s = seeds[policy]["repeats"]["ttft_p50_ms"]
        assert len(p50s) == 2 and p50s[0] == alone[policy]["ttft_p50_ms"]
        assert "repeats" not in alone[policy]
    assert "per seed, 4 nodes" in printed and "| seed 7 | seed 11 |" in printed
    assert "between 2 seeds, 4 nodes" in printed and "| oracle | ttft_p50_ms | 2 |" in printed


@pytest.mark.parametrize("argv, message", [
    (["--trace", "t.jsonl", "--seeds", "7,11"], "--synthetic"),
    (["--synthetic", "document-bursts", "--seeds", "7,7"], "each seed once"),
    (["--synthetic", "document-bursts", "--seeds", "7,x"], "integers"),
    (["--synthetic", "document-bursts", "--seeds", "7,11", "--sweep", "link=tcp-25g"], "--sweep"),
])
def test_bad_seeds_fail_before_any_simulation(argv, message):
    with pytest.raises(InvalidArgument, match=message):
        cli.parse_args(argv)


def test_a_seed_set_of_the_committed_file_names_its_seeds():
    args = cli.parse_args(["--synthetic", "document-bursts", "--seeds", "evaluation"])
    assert args.seed_list == [7, 11, 13]
    assert cli.parse_args(["--synthetic", "document-bursts", "--seeds", "tuning"]).seed_list == [17, 19, 23, 29]


def test_an_unknown_seed_set_names_the_sets_there_are():
    with pytest.raises(InvalidArgument, match="evaluation, tuning"):
        cli.parse_args(["--synthetic", "document-bursts", "--seeds", "evaluaton"])
