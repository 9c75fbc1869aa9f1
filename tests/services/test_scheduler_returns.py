"""The live `predictive` policy plans on session returns served over gRPC.

A real scheduler server (its policy ticked by hand) and a real predictor
with a saved return model, on loopback: a conversation whose prefix sits in
its one node's host tier has just finished a turn. With return forecasts the
planner prefetches that prefix into the device tier ahead of the likely
return; without a return model (ForecastReturns: FAILED_PRECONDITION) it
plans on family bursts alone, and three requests in two minutes are no
burst, so it issues nothing. Also: the remote source yields RETURN and
RETENTION forecasts through the real RPC, and [] from a predictor without
a model or one that is down."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.rpc.server import open_channel
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.common.tiers import Tier
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server as build_predictor
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.remote import PredictorReturnForecasts
from speckv.services.scheduler.adapters.server import build_server as build_scheduler
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.forecasts import ForecastKind
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.orders import ActionKind
from speckv.v1 import predictor_pb2 as pb
from speckv.v1 import predictor_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tests.support.returns_model import save_synthetic_model
from tests.support.waiting import TIMEOUT, wait_until

NOW = 30_000.0
BS = 16
CHAIN = list(range(5000, 5128))  # 128 blocks of 16 tokens: the conversation's prefix
FAMILY = "talk"
POLICY = load_policy_config()


@pytest.fixture(scope="module")
def returns_dir(tmp_path_factory) -> Path:
    return save_synthetic_model(tmp_path_factory.mktemp("returns") / "model")


@contextlib.contextmanager
def predictor(clock: ManualClock, returns_dir: Path | None):
    config = PredictorConfig(port=0, grace_s=1.0, returns_model=str(returns_dir) if returns_dir else "")
    server = build_predictor(config, build_telemetry("predictor", {}), clock=clock).start()
    channel = open_channel(server.address, None)
    try:
        yield server.address, predictor_pb2_grpc.PredictorStub(channel)
    finally:
        channel.close()
        server.stop(grace_s=0.5)


@contextlib.contextmanager
def scheduler(clock: ManualClock, predictor_address: str) -> Iterator[tuple[SchedulerCore, object]]:
    """One node n0 (512 device pages, 1024 host pages) holding CHAIN in its
    host tier only; the ticker never fires (tick_s an hour): the test ticks."""
    cores: list[SchedulerCore] = []

    def inventory(core: SchedulerCore) -> None:
        cores.append(core)
        core.register_node("n0", "127.0.0.1:1", NodeSizes(512, 1024), None)
        assert core.apply_kv_event(NodeId("n0"), core.generation("n0"),
                                   IndexEvent(HolderEventKind.STORED, CHAIN, False, FAMILY, tier=Tier.HOST))
        core.heartbeat("n0", NodeLoad(free_pages=512))

    config = SchedulerConfig(port=0, grace_s=1.0, policy="predictive", predictor=predictor_address, tick_s=3600.0,
                             engine_profile="llama-3-8b-h100", host_link_gbps=400.0, host_link_overhead_ms=0.05,
                             confirm_routes=False)
    server = build_scheduler(config, build_telemetry("scheduler", {}), clock=clock, inventory=inventory).start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield cores[0], scheduler_pb2_grpc.SchedulerStub(channel)
    finally:
        channel.close()
        server.stop(grace_s=1.0)


def a_turn_just_ended(sched, pred, clocks: tuple[ManualClock, ManualClock]) -> None:
    """Two earlier turns of the conversation (reported to the predictor
    directly), then its third routed through the scheduler at NOW (which
    reports the arrival) and finished 8 s later (the router reports it)."""
    prompts = [9_000, 9_600, (len(CHAIN) + 1) * BS + 3]
    for i, (arrival, end) in enumerate(((-100.0, -92.0), (-52.0, -44.0))):
        pred.ObserveArrivals(iter([pb.Arrival(time_s=NOW + arrival, family=FAMILY, prompt_tokens=prompts[i])]),
                             timeout=TIMEOUT)
        pred.ReportTurnEnds(pb.TurnEndBatch(turn_ends=[pb.TurnEnd(
            conversation=FAMILY, arrival_s=NOW + arrival, end_s=NOW + end, prompt_tokens=prompts[i],
            output_tokens=250)]), timeout=TIMEOUT)
    sched.Route(scheduler_pb2.RouteRequest(request_id="turn-2", block_hashes=[*CHAIN, 9_999_999],
                                           prompt_tokens=prompts[2], family=FAMILY), timeout=TIMEOUT)
    assert wait_until(lambda: pred.GetModelInfo(pb.ModelInfoRequest(), timeout=TIMEOUT).observations_total == 3)
    for clock in clocks:
        clock.set(NOW + 8.0)
    pred.ReportTurnEnds(pb.TurnEndBatch(turn_ends=[pb.TurnEnd(
        conversation=FAMILY, arrival_s=NOW, end_s=NOW + 8.0, prompt_tokens=prompts[2], output_tokens=250)]),
        timeout=TIMEOUT)


@pytest.mark.parametrize("with_model", [True, False])
def test_predictive_prefetches_a_likely_returner_only_with_return_forecasts(returns_dir, with_model):
    sclock, pclock = ManualClock(NOW), ManualClock(NOW)
    with predictor(pclock, returns_dir if with_model else None) as (address, pred), \
            scheduler(sclock, address) as (core, sched):
        core.tick()  # the policy's first plan, before anything is known
        a_turn_just_ended(sched, pred, (sclock, pclock))
        core.heartbeat("n0", NodeLoad(free_pages=512))
        if with_model:
            reply = pred.ForecastReturns(pb.ForecastReturnsRequest(within_s=POLICY.leases.replica_lease_ms / 1e3),
                                         timeout=TIMEOUT)
            assert [r.conversation for r in reply.returns] == [FAMILY]
            assert reply.returns[0].probability >= POLICY.planner.min_return_probability  # the fixture can drive it
        orders = core.tick()
        if with_model:
            assert [(o.spec.action, o.spec.source, o.spec.target, o.spec.tier) for o in orders] == [
                (ActionKind.PREFETCH, "n0", "n0", Tier.DEVICE)]
            assert orders[0].spec.block_hashes == CHAIN and orders[0].spec.policy == "predictive"
            assert orders[0].spec.expected_benefit_ms > 0
        else:
            assert orders == []
            sclock.set(NOW + 9.5)
            assert core.tick() == []  # planned again (plan_every_s 1 s): still nothing


def test_the_remote_source_yields_return_and_retention_forecasts_through_the_rpc(returns_dir):
    sclock, pclock = ManualClock(NOW), ManualClock(NOW)
    with predictor(pclock, returns_dir) as (address, pred), scheduler(sclock, address) as (_, sched):
        a_turn_just_ended(sched, pred, (sclock, pclock))
        source = PredictorReturnForecasts(address, None, POLICY)
        try:
            forecasts = source.forecast(NOW + 8.0, POLICY.planner.horizon_s, POLICY.planner.max_families_per_tick)
        finally:
            source.close()
        lease_s, ttl_s = POLICY.leases.replica_lease_ms / 1e3, POLICY.retain.ttl_s
        assert [(f.family, f.kind, f.horizon_s) for f in forecasts] == [
            (FAMILY, ForecastKind.RETURN, lease_s), (FAMILY, ForecastKind.RETENTION, ttl_s)]
        short, long = forecasts
        assert 0 < short.expected_count < long.expected_count <= 1
        assert short.upper_quantile == short.expected_count and long.upper_quantile == long.expected_count


def test_the_remote_source_is_empty_without_a_model_or_a_predictor():
    with predictor(ManualClock(NOW), None) as (address, _):
        source = PredictorReturnForecasts(address, None, POLICY)
        try:
            assert source.forecast(NOW, 2.0, 256) == []
        finally:
            source.close()
    source = PredictorReturnForecasts("127.0.0.1:1", None, POLICY, timeout_s=0.5)
    try:
        assert source.forecast(NOW, 2.0, 256) == []
    finally:
        source.close()
