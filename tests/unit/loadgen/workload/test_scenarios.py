"""Named synthetic scenarios (loadgen/workload/scenarios.py): the committed file
loads whole, each scenario builds the workload its parameters say, and a
bad file or name is refused before anything runs."""
from __future__ import annotations

import dataclasses
import json

import pytest

from speckv.loadgen.sim import cli, pool
from speckv.loadgen.workload.fanout import FanoutParams
from speckv.loadgen.workload.scenarios import (
    DEFAULT_SCENARIOS_PATH,
    GENERATORS,
    get_scenario,
    load_scenarios,
    parse_seeds,
    seed_sets,
)
from speckv.loadgen.workload.synthetic import HawkesParams
from speckv.services.common.errors import InvalidArgument

COMMITTED = json.loads(DEFAULT_SCENARIOS_PATH.read_text())["scenarios"]


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_every_committed_scenario_builds_the_workload_its_file_says(name):
    raw = COMMITTED[name]
    scenario = get_scenario(name, seed=11, block_tokens=64)
    assert isinstance(scenario.params, GENERATORS[raw["generator"]])
    assert scenario.params.seed == 11 and scenario.shape.block_tokens == 64 and scenario.note
    for key, value in raw["params"].items():
        assert getattr(scenario.params, key) == (tuple(value) if isinstance(value, list) else value)
    for key, value in raw["shape"].items():
        assert getattr(scenario.shape, key) == (tuple(value) if isinstance(value, list) else value)
    short = dataclasses.replace(scenario, params=dataclasses.replace(scenario.params, duration_s=60.0))
    requests = short.requests()
    assert requests and all(0.0 <= r.arrival_s < 60.0 for r in requests)
    prefix = scenario.shape.prefix_blocks
    if isinstance(scenario.params, FanoutParams):  # a task's calls grow past the suffix (test_fanout.py)
        assert all(prefix < len(r.block_hashes) for r in requests)
    else:
        assert all(prefix < len(r.block_hashes) <= prefix + scenario.shape.max_suffix_blocks for r in requests)
    assert all(r.block_tokens == 64 for r in requests)
    described = short.describe()
    assert described["scenario"] == name and described["generator"] == type(scenario.params).__name__


def _write(tmp_path, scenarios: dict) -> str:
    path = tmp_path / "scenarios.json"
    path.write_text(json.dumps({"scenarios": scenarios}))
    return str(path)


def test_a_users_file_overrides_only_the_keys_it_names(tmp_path):
    path = _write(tmp_path, {"mine": {"generator": "hawkes", "params": {"mu": 0.5}, "shape": {"families": 3}}})
    scenario = get_scenario("mine", seed=2, block_tokens=16, path=path)
    defaults = HawkesParams()
    assert (scenario.params.mu, scenario.params.branching, scenario.params.decay) == (0.5, defaults.branching,
                                                                                      defaults.decay)
    assert scenario.shape.families == 3 and list(load_scenarios(path)) == ["mine"]


@pytest.mark.parametrize("scenarios, message", [
    ({"x": {"generator": "poisson"}}, "generator must be one of"),
    ({"x": {"generator": "mmpp", "params": {"rate": 3}}}, "unknown params key(s) rate"),
    ({"x": {"generator": "mmpp", "shape": {"prefix": 3}}}, "unknown shape key(s) prefix"),
    ({"x": {"generator": "hawkes", "params": {"branching": 1.0}}}, "branching must be in [0, 1)"),
    ({"x": {"generator": "mmpp", "shape": {"prefix_blocks": 0}}}, "prefix_blocks"),
    ({"x": {"generator": "mmpp", "shape": {"output_tokens": [9, 3]}}}, "output_tokens"),
])
def test_a_bad_scenario_is_refused_naming_what_is_wrong(tmp_path, scenarios, message):
    with pytest.raises(InvalidArgument, match="scenario 'x'") as info:
        get_scenario("x", seed=1, block_tokens=16, path=_write(tmp_path, scenarios))
    assert message in str(info.value)


def test_an_unknown_name_lists_the_scenarios():
    with pytest.raises(InvalidArgument, match="no such scenario") as info:
        get_scenario("nope", seed=1, block_tokens=16)
    assert all(name in str(info.value) for name in COMMITTED)


@pytest.mark.parametrize("argv", [
    ["--synthetic", "nope"],
    ["--trace", "t.jsonl", "--scenarios", "s.json"],  # --scenarios without --synthetic
    ["--synthetic", "mmpp", "--trace", "t.jsonl"],
])
def test_simulate_refuses_bad_scenario_arguments_before_running(argv):
    with pytest.raises(InvalidArgument):
        cli.main([*argv, "--policies", "none", "--duration-s", "1"], {})


def test_simulate_runs_a_users_scenario_and_reports_its_parameters(tmp_path):
    path = _write(tmp_path, {"tiny": {"generator": "mmpp", "note": "two families",
                                      "params": {"duration_s": 20.0, "rate_calm": 1.0, "rate_burst": 4.0},
                                      "shape": {"families": 2, "prefix_blocks": 2, "max_suffix_blocks": 1}}})
    out = tmp_path / "result.json"
    code = cli.main(["--synthetic", "tiny", "--scenarios", path, "--policies", "none", "--jobs", "1",
                     "--json", str(out)], {})
    assert code == 0
    result = json.loads(out.read_text())
    assert result["trace"] == "synthetic:tiny"
    note = next(n for n in result["notes"] if n.startswith("Synthetic workload 'tiny'"))
    described = json.loads(note.split(": ", 1)[1])
    assert described["rate_burst"] == 4.0 and described["families"]["prefix_blocks"] == 2
    assert described["note"] == "two families"
    served = result["policies"]["none"]["served"]
    assert served > 0
    summary = result["policies"]["none"]
    assert 0 < summary["cpu_s"] and summary["events_per_s"] == summary["simulated_events"] / summary["cpu_s"]
    assert 0 < summary["peak_rss_mb"] == result["peak_rss_mb"]  # one simulation: the largest is its own
    machine = result["machine"]
    assert machine["cores"] >= 1 and machine["reference_loop_ms"] > 0 and machine["python"].startswith("3.")


def test_the_largest_node_counts_are_submitted_first_and_the_predictor_policies_first_within_one():
    from speckv.loadgen.sim.jobs import Job
    from speckv.loadgen.sim.pool import submission_order

    policies = ("none", "oracle", "predictive")
    jobs = [Job("t", 7, n, p, None, None, "builtin", 1.0, None) for n in (8, 64, 256) for p in policies]
    assert [(j.nodes, j.policy) for j in submission_order(jobs)] == [
        (256, "predictive"), (256, "none"), (256, "oracle"), (64, "predictive"), (64, "none"), (64, "oracle"),
        (8, "predictive"), (8, "none"), (8, "oracle")]


@pytest.mark.parametrize("cores,expected", [(1, 2), (2, 3), (16, 17), (0, 2)])
def test_one_more_simulation_than_cores_runs_at_once_by_default(cores, expected):
    assert pool.default_jobs(cores) == expected


def test_the_committed_seed_sets_keep_evaluation_and_tuning_apart():
    sets = seed_sets()
    assert sets["evaluation"] == [7, 11, 13]
    assert not set(sets["evaluation"]) & set(sets["tuning"])


def test_a_users_file_with_its_own_seed_sets_is_read_and_one_without_falls_back(tmp_path):
    own = tmp_path / "own.json"
    own.write_text(json.dumps({"seeds": {"mine": [3, 5]}, "scenarios": {"x": {"generator": "mmpp"}}}))
    assert parse_seeds("mine", own) == [3, 5]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"scenarios": {"x": {"generator": "mmpp"}}}))
    assert parse_seeds("evaluation", bare) == [7, 11, 13]
    assert parse_seeds("5,3", bare) == [5, 3]


@pytest.mark.parametrize("seeds", [[], [1, 1], ["7"], 7])
def test_a_bad_seed_set_is_refused_naming_it(tmp_path, seeds):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"seeds": {"broken": seeds}, "scenarios": {"x": {"generator": "mmpp"}}}))
    with pytest.raises(InvalidArgument, match="'broken'"):
        seed_sets(bad)


def test_api_bursts_shares_little_prefix_and_bursts_one_prompt_past_what_one_node_computes():
    """The compute-bound regime of issue 45 (item 5): the system prompts are
    under a fifth of the prompt tokens, and a burst puts several requests a
    second on one prompt, each ~0.2 s of prefill alone (the profile's figure)."""
    requests = get_scenario("api-bursts", 7, 512).requests()
    shared = sum(min(r.prompt_tokens, 2 * 512) for r in requests) / sum(r.prompt_tokens for r in requests)
    assert shared < 0.2
    per_second: dict[tuple[int, str], int] = {}
    for r in requests:
        key = (int(r.arrival_s), r.family)
        per_second[key] = per_second.get(key, 0) + 1
    hottest = sorted(per_second.values())[-20:]  # the burst seconds: one prompt, many requests
    prefill_s = 0.2
    assert min(hottest) * prefill_s > 1.0  # more prefill a second than one node has
