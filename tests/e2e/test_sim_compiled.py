"""The mypyc-compiled simulator gives exactly the source's results.

Runs a real slice of the Mooncake conversation trace through `speckv
simulate` twice, on the compiled build and on the source, and compares every
figure of every policy's summary except the wall time. Needs a current build
(`make sim-compiled`; CI builds it before the tests); without one, the test
builds its own (about 40 s)."""
from __future__ import annotations

import json

import pytest

from speckv.loadgen.sim import cli
from speckv.loadgen.sim.compiled import PackageRoots, build, current, default_dir

TIMING = {"wall_s", "cpu_s", "events_per_s", "peak_rss_mb"}  # what the machine and the build set


@pytest.fixture(scope="module")
def compiled_dir(tmp_path_factory):
    roots = PackageRoots.of_installed()
    return current(default_dir(roots), roots) or build(tmp_path_factory.mktemp("sim") / "compiled", roots)


def simulate(traces_dir, tmp_path, compiled: str, compiled_dir) -> dict:
    out = tmp_path / f"{compiled}.json"
    code = cli.main(["--trace", str(traces_dir / "mooncake_conversation_trace.jsonl"), "--nodes", "8,16",
                     "--policies", cli.ALL_POLICIES, "--start-s", "1200", "--duration-s", "60",
                     "--jobs", "2", "--compiled", compiled, "--compiled-dir", str(compiled_dir), "--json", str(out)], {})
    assert code == 0
    return json.loads(out.read_text())


def test_compiled_and_source_simulations_agree_exactly(traces_dir, tmp_path, compiled_dir):
    compiled = simulate(traces_dir, tmp_path, "on", compiled_dir)
    source = simulate(traces_dir, tmp_path, "off", compiled_dir)
    assert compiled["code"] == "mypyc" and source["code"] == "python"
    assert compiled["by_nodes"].keys() == source["by_nodes"].keys() == {"8", "16"}
    for nodes, entry in compiled["by_nodes"].items():
        for policy, summary in entry["policies"].items():
            other = source["by_nodes"][nodes]["policies"][policy]
            assert {k: v for k, v in summary.items() if k not in TIMING} == \
                   {k: v for k, v in other.items() if k not in TIMING}, (nodes, policy)
    # The slice did exercise replication and pulls, so the compiled network and order paths ran.
    assert compiled["by_nodes"]["16"]["policies"]["oracle"]["bytes_replicated"] > 0
