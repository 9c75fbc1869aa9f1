"""--load-nodes: every node count serves one workload, so nodes_needed compares counts, not loads."""
from __future__ import annotations

import json

import pytest

from speckv.loadgen.sim import cli
from speckv.services.common.errors import InvalidArgument


def run(tmp_path, *extra: str) -> dict:
    out = tmp_path / "r.json"
    assert cli.main(["--synthetic", "document-bursts", "--nodes", "4,8", "--start-s", "600", "--duration-s", "20",
                     "--policies", "none", "--jobs", "2", "--compiled", "off", "--json", str(out), *extra], {}) == 0
    return json.loads(out.read_text())


def test_with_a_fixed_load_both_counts_serve_the_same_requests(tmp_path):
    fixed = run(tmp_path, "--load-nodes", "4")
    rows = fixed["by_nodes"]
    assert rows["4"]["requests"] == rows["8"]["requests"]
    assert fixed["nodes_needed"]["load_nodes"] == 4 and set(fixed["nodes_needed"]["policies"]) == {"none"}
    scaled = run(tmp_path)
    assert scaled["by_nodes"]["8"]["requests"] > scaled["by_nodes"]["4"]["requests"]  # a copy per 4 nodes
    assert scaled["nodes_needed"]["load_nodes"] is None


def test_a_bad_load_is_refused():
    with pytest.raises(InvalidArgument, match="load-nodes"):
        cli.parse_args(["--synthetic", "document-bursts", "--load-nodes", "0"])
