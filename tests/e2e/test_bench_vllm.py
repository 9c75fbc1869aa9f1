"""`speckv bench vllm`'s measurement on a short prompt (16 blocks): the
loaded, recomputed and prefix-cached answers agree, every block of the
prefix is loaded, and the figures are there. Nothing about times."""
from __future__ import annotations

import pytest

from speckv.loadgen.bench.vllm.cli import measure, parse

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_the_bench_loads_the_whole_prefix_and_agrees_with_the_recompute(tmp_path):
    result = measure(16, tmp_path)
    assert result["tokens_identical"] is True
    assert result["blocks_loaded"] == 16 and result["failures"] == {
        "lookup_failures": 0, "load_failures": 0, "save_failures": 0}
    for key in ("recompute_s", "loaded_s", "prefix_cache_s", "load_over_recompute_513", "connector_load_gbps",
                "memcpy_gbps"):
        assert result[key] > 0, key


def test_quick_and_json_flags():
    options = parse(["--quick", "--json"])
    assert options.quick and options.json == "-"
    assert parse(["--json", "out.json"]).json == "out.json" and parse([]).json is None
