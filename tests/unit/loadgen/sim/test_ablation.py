"""Policies with one action turned off (ablation.py): names, the config
switch each turns off, a variant run that issues none of that action, and
the measured-saving arithmetic."""
from __future__ import annotations

import dataclasses

import pytest

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.sim.ablation import (
    RunFigures,
    Variant,
    ablation_rows,
    ablation_table,
    config_without,
    parse_variant,
)
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.services.common.errors import InvalidArgument
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.orders import ActionKind
from tests.support.sim_slices import slice_with_history

CONFIG = load_e2e_config()


@pytest.mark.parametrize("name, variant", [
    ("none", Variant("none", None)),
    ("predictive", Variant("predictive", None)),
    ("predictive-without-retain", Variant("predictive", ActionKind.RETAIN)),
    ("oracle-without-replicate", Variant("oracle", ActionKind.REPLICATE)),
    ("oracle-without-prefetch", Variant("oracle", ActionKind.PREFETCH)),
])
def test_names(name, variant):
    assert parse_variant(name) == variant


@pytest.mark.parametrize("name", ["none-without-retain", "predictive-without-evict", "predictive-without-"])
def test_bad_names_are_invalid(name):
    with pytest.raises(InvalidArgument):
        parse_variant(name)


@pytest.mark.parametrize("action, section, switch", [
    (ActionKind.REPLICATE, "planner", "replicate"),
    (ActionKind.REDUNDANT, "planner", "redundancy"),
    (ActionKind.PREFETCH, "planner", "prefetch"),
    (ActionKind.RETAIN, "retain", "enabled"),
])
def test_each_action_turns_off_its_own_switch_only(action, section, switch):
    config = load_policy_config()
    off = config_without(config, action)
    assert getattr(getattr(off, section), switch) is False
    assert dataclasses.replace(off, **{section: getattr(config, section)}) == config


def test_measured_saving_is_the_ttft_the_run_without_the_action_spent_more():
    runs = [RunFigures(8, "predictive", [100.0, 200.0, 300.0], {"retain": {"orders": 4, "expected_ms": 5000.0}}, 300.0),
            RunFigures(8, "predictive-without-retain", [100.0, 900.0, 300.0], None, 900.0),
            RunFigures(16, "predictive-without-prefetch", [1.0], None, 1.0)]  # its policy did not run at 16
    (row,) = ablation_rows(runs)
    assert (row.nodes, row.policy, row.action, row.orders) == (8, "predictive", "retain", 4)
    assert row.expected_s == pytest.approx(5.0) and row.measured_s == pytest.approx(0.7)
    assert (row.returning_p99_ms, row.returning_p99_without_ms) == (300.0, 900.0)
    assert "| 8 | predictive | retain | 4 | 5.0 | 0.7 |" in ablation_table([row])
    assert ablation_table([]) == ""


def test_a_variant_run_issues_none_of_the_action_it_turns_off(traces_dir):
    history, requests = slice_with_history(traces_dir, CONFIG.family, 1800.0, 60.0, 300.0)
    settings = dataclasses.replace(SimSettings.from_e2e(CONFIG), drain_s=120.0)
    full = Simulation(CONFIG, settings, "oracle", requests, history).run()
    without = Simulation(CONFIG, settings, "oracle-without-retain", requests, history).run()
    assert full.actions.get("retain", {}).get("orders", 0) > 0  # the slice gives it something to retain
    assert "retain" not in without.actions and without.policy == "oracle-without-retain"
