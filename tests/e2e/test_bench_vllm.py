"""`speckv bench vllm`'s measurement on a short prompt (16 blocks): the
loaded, recomputed and prefix-cached answers agree over both connector paths
(shared memory and gRPC), on a peer the prefix was replicated to and on one
that pulled it at request time, every
block of the prefix is loaded over the path asked, and the figures are there. Nothing about times."""
from __future__ import annotations

import pytest

from speckv.loadgen.bench.vllm.cli import measure, parse

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_the_bench_loads_the_whole_prefix_over_both_paths_and_agrees_with_the_recompute(tmp_path):
    result = measure(16, tmp_path)
    assert result["tokens_identical"] is True
    for path in ("shm", "grpc"):
        row = result[path]
        assert row["blocks_loaded"] == 16 and row["failures"] == {
            "lookup_failures": 0, "load_failures": 0, "save_failures": 0}, path
        for key in ("recompute_s", "loaded_s", "prefix_cache_s", "connector_load_gbps"):
            assert row[key] > 0, (path, key)
    assert result["shm"]["blocks_loaded_shared"] == 16 and result["grpc"]["blocks_loaded_shared"] == 0
    assert result["shm"]["peer_blocks_loaded"] == 16 and result["shm"]["peer_transport"] == "shm"
    assert result["shm"]["pull_blocks"] == 16  # pulled at request time from the first kvstore
    for key in ("load_over_recompute_513", "peer_load_over_recompute_513", "pull_load_over_recompute_513",
                "connector_load_over_memcpy",
                "grpc_connector_load_over_memcpy"):
        assert result["ratios"][key] > 0, key
    assert result["memcpy_gbps"] > 0 and result["connector_load_gbps"] == result["shm"]["connector_load_gbps"]


def test_quick_and_json_flags():
    options = parse(["--quick", "--json"])
    assert options.quick and options.json == "-"
    assert parse(["--json", "out.json"]).json == "out.json" and parse([]).json is None
    assert parse(["--fit-profile"]).fit_profile and not parse([]).fit_profile
    assert parse(["--no-save-ratio"]).no_save_ratio
