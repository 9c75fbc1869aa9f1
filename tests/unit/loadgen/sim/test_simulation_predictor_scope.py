"""The simulator runs the predictor only for the policies that read its
forecasts (FORECAST_POLICIES). For every other policy, running it anyway
must change nothing: same routes, same TTFTs, same replicas, same orders.
The only difference is the cost, which was a sixth of a 256-node `none` run."""
from __future__ import annotations

import dataclasses

import pytest

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.sim import cli, forecast_wiring, jobs
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.services.cluster.status import wide_console
from speckv.services.common.errors import FailedPrecondition
from speckv.services.scheduler.policies.registry import FORECAST_POLICIES, POLICY_NAMES
from tests.support.sim_slices import slice_with_history

CONFIG = load_e2e_config()
SLICE_START_S, SLICE_S, HISTORY_S = 1800.0, 20.0, 60.0
OTHER_POLICIES = [p for p in POLICY_NAMES if p not in FORECAST_POLICIES]


@pytest.fixture(scope="module")
def trace(traces_dir):
    return slice_with_history(traces_dir, CONFIG.family, SLICE_START_S, SLICE_S, HISTORY_S)


def simulate(policy: str, trace):
    history, requests = trace
    settings = dataclasses.replace(SimSettings.from_e2e(CONFIG), drain_s=120.0)
    return Simulation(CONFIG, settings, policy, requests, history).run()


def outcome(run):
    records = [(r.request_id, r.node_id, r.cached_tokens, r.fetched_tokens, r.ttft_ms, r.e2e_ms, r.replica_blocks,
                r.error) for r in run.records]
    return records, run.replicas, run.orders, run.network_bytes


def test_only_the_predictive_policy_reads_forecasts():
    assert FORECAST_POLICIES == {"predictive"}


@pytest.mark.parametrize("policy", OTHER_POLICIES)
def test_a_policy_that_reads_no_forecasts_gets_the_same_run_without_the_predictor(trace, policy, monkeypatch):
    without = simulate(policy, trace)
    assert without.forecasts == [] and without.predictor.startswith("not run")
    monkeypatch.setattr(forecast_wiring, "FORECAST_POLICIES", FORECAST_POLICIES | {policy})
    with_predictor = simulate(policy, trace)
    assert with_predictor.forecasts and with_predictor.predictor == "builtin EWMA"  # it really ran this time
    assert all(r.served for r in without.records)
    assert outcome(without) == outcome(with_predictor)


def test_the_predictive_policy_runs_the_predictor_and_cannot_run_without_it(trace, monkeypatch):
    run = simulate("predictive", trace)
    assert run.forecasts and run.predictor == "builtin EWMA"
    monkeypatch.setattr(forecast_wiring, "FORECAST_POLICIES", frozenset())
    with pytest.raises(FailedPrecondition, match="needs forecasts"):
        simulate("predictive", trace)


@pytest.mark.parametrize("policies, trains", [("none,oracle", False), ("none,predictive", True)])
def test_lightgbm_is_trained_only_when_a_policy_reads_forecasts(traces_dir, policies, trains):
    path = traces_dir / "mooncake_conversation_trace.jsonl"
    args = cli.parse_args(["--trace", str(path), "--policies", policies, "--start-s", "600", "--duration-s", "5",
                           "--predictor", "lightgbm"])
    first = jobs.Job(str(path), 7, CONFIG.nodes, "none", 600.0, 5.0, "lightgbm", 1.0, None)
    trained = jobs.train_once(args, CONFIG, first, wide_console())
    assert (trained is not None) == trains


def test_the_online_predictor_refits_inside_the_simulation_in_virtual_time(trace, monkeypatch):
    from speckv.loadgen.sim import online_counts

    monkeypatch.setattr(online_counts, "REFIT_INTERVAL_S", 5.0)  # four refits in the 20 s slice
    history, requests = trace
    settings = dataclasses.replace(SimSettings.from_e2e(CONFIG), drain_s=120.0, predictor="online")
    run = Simulation(CONFIG, settings, "predictive", requests, history).run()
    assert all(r.served for r in run.records)
    assert run.predictor.startswith("builtin EWMA until the first validated online refit")
    assert "count and burst models refitted online every 5 s" in run.predictor
