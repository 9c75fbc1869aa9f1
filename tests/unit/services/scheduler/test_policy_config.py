import json

import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.scheduler.policy_config import DEFAULT_POLICIES_PATH, load_policy_config
from speckv.services.scheduler.load_board import LoadBoard


def test_the_committed_configuration_loads():
    config = load_policy_config()
    assert config.planner.demand in ("upper_quantile", "expected_count") and config.leases.replica_lease_ms > 0


@pytest.mark.parametrize("section,key,value,match", [
    ("planner", "horizon_s", 0, "planner.horizon_s"),
    ("budgets", "link_budget_fraction", 1.5, "budgets.link_budget_fraction"),
    ("planner", "demand", "vibes", "planner.demand"),
    ("planner", "failure_rate_per_node_hour", -1.0, "planner.failure_rate_per_node_hour"),
    ("planner", "failure_rate_per_node_hour", float("inf"), "planner.failure_rate_per_node_hour"),
    ("reactive_heat", "heat_threshold", None, "reactive_heat.heat_threshold is missing"),
])
def test_bad_thresholds_name_their_key(tmp_path, section, key, value, match):
    raw = json.loads(DEFAULT_POLICIES_PATH.read_text())
    if value is None:
        del raw[section][key]
    else:
        raw[section][key] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(InvalidArgument, match=match):
        load_policy_config(path)


def test_load_board_returns_least_loaded_live_nodes():
    board = LoadBoard()
    for i, load in enumerate([5.0, 1.0, 3.0, 0.5, 2.0]):
        board.upsert(f"n{i}", load, last_heartbeat=100.0 if i != 3 else 0.0)  # n3 is silent
    assert board.least_loaded(3, now=101.0, timeout_s=5.0) == ["n1", "n4", "n2"]
    assert board.least_loaded(2, now=101.0, timeout_s=5.0, exclude={"n1"}) == ["n4", "n2"]
    board.set_load("n1", 10.0)
    assert board.least_loaded(5, now=101.0, timeout_s=5.0) == ["n4", "n2", "n0", "n1"]
    board.upsert("n3", 0.5, last_heartbeat=101.0)  # a heartbeat revives the parked node
    assert board.least_loaded(1, now=101.0, timeout_s=5.0) == ["n3"]


def test_load_board_counts_only_the_given_nodes_towards_k():
    board = LoadBoard()
    for i, load in enumerate([5.0, 1.0, 3.0, 0.5, 2.0]):
        board.upsert(f"n{i}", load, last_heartbeat=100.0)
    # least loaded first (n3 n1 n4 n2 n0), up to the 2nd of {n2, n0}
    assert board.least_loaded(2, now=101.0, timeout_s=5.0, counted={"n2", "n0"}) == ["n3", "n1", "n4", "n2", "n0"]
    assert board.least_loaded(1, now=101.0, timeout_s=5.0, exclude={"n3"}, counted={"n1"}) == ["n1"]
    assert board.least_loaded(3, now=101.0, timeout_s=5.0, counted={"n9"}) == ["n3", "n1", "n4", "n2", "n0"]
    assert board.least_loaded(5, now=101.0, timeout_s=5.0) == ["n3", "n1", "n4", "n2", "n0"]  # all still there
