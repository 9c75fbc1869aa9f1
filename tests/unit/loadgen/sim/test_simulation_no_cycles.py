"""A simulation with the builtin predictor runs with automatic garbage
collection off (loadgen/sim/cli.py), which is safe only while it makes no
cyclic garbage: reference counting frees everything else at once. Each
policy runs a slice of the real trace with collection off; a collection
afterwards, with the simulation still alive, must find nothing unreachable.
LightGBM's predict does leave cycles, which is why a LightGBM run keeps
collection on."""
from __future__ import annotations

import dataclasses
import gc

import pytest

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.sim import jobs, scheduler_side
from speckv.loadgen.sim.predictor import train_lightgbm
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.services.scheduler.policies.registry import POLICY_NAMES
from tests.support.sim_slices import slice_with_history

CONFIG = load_e2e_config()
SLICE_START_S, SLICE_S, HISTORY_S = 1800.0, 40.0, 120.0


@pytest.fixture(scope="module")
def trace(traces_dir):
    return slice_with_history(traces_dir, CONFIG.family, SLICE_START_S, SLICE_S, HISTORY_S)


def garbage_cycles_of_a_run(policy: str, predictor: str, trace) -> tuple[int, int]:
    """(unreachable objects a collection finds after the run, requests served)."""
    history, requests = trace
    trained = train_lightgbm(history) if predictor == "lightgbm" else None
    settings = dataclasses.replace(SimSettings.from_e2e(CONFIG, nodes=16, predictor=predictor), drain_s=120.0)
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sim = Simulation(CONFIG, settings, policy, requests, history, trained=trained)
        run = sim.run()
        found = gc.collect()  # sim is still referenced: only what the run made and dropped
    finally:
        if was_enabled:
            gc.enable()
    return found, sum(r.served for r in run.records)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_simulation_makes_no_cyclic_garbage(trace, policy):
    found, served = garbage_cycles_of_a_run(policy, "builtin", trace)
    assert served == len(trace[1])
    assert found == 0


def test_lightgbm_leaves_cycles_so_its_runs_keep_collection_on(trace):
    found, _ = garbage_cycles_of_a_run("predictive", "lightgbm", trace)
    assert found > 0  # when this fails, LightGBM stopped leaving cycles: its runs could turn collection off too
    for predictor, policy, collecting in [("lightgbm", "predictive", True), ("lightgbm", "none", False),
                                          ("builtin", "predictive", False)]:
        job = jobs.Job("t", 7, 16, policy, None, None, predictor, 1.0, None)
        with jobs.collection_for(job):
            assert gc.isenabled() == collecting


def test_the_check_sees_a_cycle_when_one_is_made(trace, monkeypatch):
    """The same check on a run that leaves one cycle per heartbeat round."""
    original = scheduler_side.heartbeat_round

    def leaky(self):
        a: list = []
        a.append(a)
        original(self)

    monkeypatch.setattr(scheduler_side, "heartbeat_round", leaky)
    found, _ = garbage_cycles_of_a_run("none", "builtin", trace)
    assert found >= SLICE_S
