"""One policy, one fresh local cluster, one replayed slice (used by `speckv
bench e2e` and `speckv demo`).

Steps: start the cluster from the committed E2EConfig (policy `none`); load
the comparison's predictor model (ReloadModel; trained before the slice only,
see e2e/model.py); warm start the cluster with the `warmup_s` of trace
before the slice (e2e/warm.py: routed through the scheduler, so the
predictor observes those arrivals at their mapped times, and the newest
requests' KV stored where they were routed); SetPolicy (a name the scheduler
rejects raises, loudly; set only now, so the policy plans nothing during the
warm start, as in the simulator); follow the KV events; replay the slice open
loop through the reference router onto the engines (emulated, or the real
torch model: e2e/engines.py), playing the run's node events if it has any
(e2e/events.py); wait for the engines to drain; collect orders by outcome
and forecasts of the hottest families (polled during the run).
"""
from __future__ import annotations

import json
import math
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import grpc

from speckv.loadgen.bench.e2e.engines import EngineSetup, build_engines, emulated_engine, engine_setup
from speckv.loadgen.bench.e2e.events import EventPlan, LiveEvents
from speckv.loadgen.bench.e2e.warm import WarmStats, warm_cluster
from speckv.loadgen.bench.returns.cli import train_for_replay
from speckv.loadgen.engines.driver import LiveEngines, TraceClock
from speckv.loadgen.engines.emulated import Engine, EngineJob
from speckv.loadgen.experiments.e2e_config import E2EConfig, SliceSpec
from speckv.loadgen.experiments.event_metrics import EventOutcome
from speckv.loadgen.experiments.kv_event_follower import EventCollector
from speckv.loadgen.experiments.metrics import RequestRecord
from speckv.loadgen.experiments.migration import DEFAULT_MIGRATION_LIMIT
from speckv.loadgen.experiments.reference_router import CLIENT_SETTINGS, ReferenceRouter
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger, ReplicaTotals
from speckv.loadgen.workload.replay import SleepWaiter, TimeMap, replay_open_loop
from speckv.services.client.reports import TurnEndReporter
from speckv.services.client.routing import RoutingClient
from speckv.services.cluster.launcher import ClusterSpec, LocalCluster
from speckv.services.common.clock import SystemClock
from speckv.services.common.errors import Unavailable
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.traces import TraceRequest
from speckv.services.scheduler.adapters.outcomes_proto import action_stats_from_proto
from speckv.services.scheduler.policies.registry import FORECAST_POLICIES
from speckv.services.scheduler.replication.outcomes import ActionStats
from speckv.v1 import (
    common_pb2,
    kvstore_pb2,
    kvstore_pb2_grpc,
    predictor_pb2,
    predictor_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)

DRAIN_TIMEOUT_S = 120.0
# The replay's origin is fixed before launch (the oracle must know it as a
# flag); the cluster must be up, the model loaded and the warm start
# (e2e/warm.py) done within the engine setup's start_budget_s
# (engines.START_BUDGET_S).
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20)]


@dataclass(slots=True)
class PolicyRun:
    policy: str
    records: list[RequestRecord]
    replicas: ReplicaTotals
    orders: dict[str, int]
    forecasts: list[tuple[float, str, float]] = field(default_factory=list)  # (trace s, family, expected count)
    wall_s: float = 0.0
    sent: int = 0
    warm: WarmStats | None = None
    jobs: dict[str, EngineJob] = field(default_factory=dict)  # request id -> its engine job (torch: output ids)
    kvstores: dict[str, kvstore_pb2.StatsResponse] = field(default_factory=dict)  # per alive node, after the drain
    node_events: list[EventOutcome] = field(default_factory=list)  # node events played (e2e/events.py)
    lifetimes: dict[str, tuple[float, float]] = field(default_factory=dict)  # node -> (joined, left), trace s
    # The policy's speculative orders by action (ActionStats, from the scheduler after the drain; kvstore bytes).
    actions: dict[str, ActionStats] = field(default_factory=dict)


def cluster_spec(config: E2EConfig, oracle_trace: Path, oracle_offset_s: float, speed: float,
                 setup: EngineSetup | None = None, predictor_args: Sequence[str] = ()) -> ClusterSpec:
    """The committed cluster, identical for every policy, its kvstores holding
    the engine setup's geometry (default: the emulated one's). The oracle's
    trace is the slice re-stamped onto the replay's wall clock (speed
    applied), its t=0 at oracle_offset_s on the scheduler's clock.
    predictor_args: extra predictor flags (the session-return model)."""
    setup = setup or engine_setup(config)
    engine_events: list[str] = []
    if setup.vllm is not None:
        from speckv.loadgen.bench.e2e import vllm_engines

        engine_events = vllm_engines.scheduler_events(setup.vllm, setup.geometry)
    link_gbps = config.link.gbps / setup.byte_scale
    preset, block_size, geometry_args = setup.cluster_geometry()
    extra = {k: list(v) for k, v in config.extra_args.items()}
    extra["scheduler"] = ["--engine-profile", config.profile.name,
                          "--link-gbps", repr(link_gbps),
                          "--link-overhead-ms", repr(config.link.overhead_ms),
                          *host_link_args(config, setup.byte_scale),
                          "--tick-s", repr(config.scheduler_tick_s),
                          "--oracle-trace", str(oracle_trace), "--oracle-offset-s", repr(oracle_offset_s),
                          "--oracle-family", config.family,
                          *engine_events,
                          *extra.get("scheduler", [])]
    # Replication moves scaled bytes on the wall clock: the kvstore's link cap
    # is the real link / byte scale x the replay's compression.
    extra["kvstore"] = ["--link-gbps", repr(link_gbps * speed), "--retain-max-share", repr(config.retain_max_share),
                        *geometry_args, *extra.get("kvstore", [])]
    extra["predictor"] = [*predictor_args, *extra.get("predictor", [])]
    return ClusterSpec(nodes=config.nodes, geometry=preset, block_size=block_size,
                       sizes=NodeSizes(config.pool_pages, config.host_pages), policy="none",
                       extra_args=extra)


def host_link_args(config: E2EConfig, byte_scale: int) -> list[str]:
    """The scheduler's host-link flags: the real host link divided by the byte
    scale, as for the node-to-node link (none without a host tier)."""
    if not config.host_pages or config.host_link is None:
        return []
    return ["--host-link-gbps", repr(config.host_link.gbps / byte_scale),
            "--host-link-overhead-ms", repr(config.host_link.overhead_ms)]


def run_policy(config: E2EConfig, policy: str, trace: Sequence[TraceRequest], slice_: SliceSpec,
               environ: Mapping[str, str], on_progress: Callable[[int, int, RequestRecord | None], None],
               run_dir: Path | None = None, model_dir: Path | None = None,
               setup: EngineSetup | None = None, events: EventPlan | None = None) -> PolicyRun:
    """model_dir: the predictor model to load before replay (None: its builtin
    one), by name: its parent is the predictor's --model-root, so keep it in a
    folder of its own (ReloadModel loads only names under the root); setup:
    the engines (None: the emulated ones). A policy that reads forecasts also
    gets session-return foresight: a return model trained on the trace
    before the slice, on the replay's clock (bench/returns.py
    train_for_replay), served by the predictor (--returns-model) with its
    tracker warmed on that history (--returns-warm), and every finished
    request reported to it as a turn end (TurnEndReporter). events: node
    events to play during the replay (None: none)."""
    setup = setup or engine_setup(config)
    requests = setup.scale([r for r in trace if slice_.start_s <= r.arrival_s < slice_.start_s + slice_.duration_s])
    warm = setup.scale([r for r in trace if slice_.start_s - config.warmup_s <= r.arrival_s < slice_.start_s])
    with tempfile.TemporaryDirectory(prefix=f"speckv-e2e-{policy}-") as tmp:
        directory = run_dir or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        returns = (train_for_replay(setup.scale([r for r in trace if r.arrival_s < slice_.start_s]), slice_.start_s,
                                    slice_.speed, directory / "returns-model")
                   if policy in FORECAST_POLICIES else None)  # before the clock starts: training takes a while
        wall0 = time.monotonic() + setup.start_budget_s
        unix0 = SystemClock().now() + setup.start_budget_s
        unix_times = TimeMap(unix0, slice_.start_s, slice_.speed)
        oracle = directory / "oracle_trace.jsonl"
        write_restamped_trace(oracle, requests, slice_)
        predictor_args = (returns.predictor_args(unix_times.to_clock, directory / "returns-warm.jsonl")
                          if returns else [])
        if model_dir is not None:
            predictor_args += ["--model-root", str(model_dir.parent)]
        cluster = LocalCluster(cluster_spec(config, oracle, unix0, slice_.speed, setup, predictor_args), directory,
                               environ)
        with cluster:
            times = TimeMap(wall0, slice_.start_s, slice_.speed)
            return _run_on(cluster, config, setup, policy, requests, warm, times, unix_times, on_progress,
                           model_dir, turn_ends=returns is not None, events=events, run_dir=directory,
                           environ=environ)


def write_restamped_trace(path: Path, requests: Sequence[TraceRequest], slice_: SliceSpec) -> None:
    """Mooncake JSONL of the slice with timestamps (ms) on the replay's clock from its origin."""
    with open(path, "w", encoding="utf-8") as out:
        for r in requests:
            ms = round((r.arrival_s - slice_.start_s) / slice_.speed * 1000)
            out.write(json.dumps({"timestamp": ms, "input_length": r.prompt_tokens,
                                  "output_length": r.output_tokens, "hash_ids": list(r.block_hashes)}) + "\n")


def _run_on(cluster: LocalCluster, config: E2EConfig, setup: EngineSetup, policy: str,
            requests: list[TraceRequest], warm: list[TraceRequest], times: TimeMap, unix_times: TimeMap,
            on_progress: Callable[[int, int, RequestRecord | None], None], model_dir: Path | None,
            turn_ends: bool = False, events: EventPlan | None = None, run_dir: Path | None = None,
            environ: Mapping[str, str] | None = None) -> PolicyRun:
    nodes = cluster.node_addresses()
    scheduler_channel = grpc.insecure_channel(cluster.scheduler_address)
    predictor_channel = grpc.insecure_channel(cluster.predictor_address)
    kv_channels = {n: grpc.insecure_channel(a, options=CHANNEL_OPTIONS) for n, a in nodes.items()}
    scheduler = scheduler_pb2_grpc.SchedulerStub(scheduler_channel)
    engine_map: dict[str, Engine] = {}
    try:
        if model_dir is not None:
            predictor_pb2_grpc.PredictorStub(predictor_channel).ReloadModel(
                predictor_pb2.ReloadModelRequest(name=model_dir.name), timeout=30.0)
        engine_map, jobs, store_kv = build_engines(setup, config, kv_channels, times.speed, nodes, run_dir, environ)
        warmed = warm_cluster(scheduler_channel, kv_channels, warm, unix_times, setup.geometry.bytes_per_block,
                              setup.warm_kv_blocks, store_kv)
        if time.monotonic() > times.origin:
            raise Unavailable(f"the cluster took over {setup.start_budget_s:g} s to start and warm; the replay's "
                              "origin (given to the oracle) has passed")
        # Only now: the warm start is routed under `none` (routing does not depend on the policy), so the policy
        # plans nothing before the slice, as in the simulator, whose warm start takes no time.
        scheduler.SetPolicy(scheduler_pb2.SetPolicyRequest(name=policy), timeout=10.0)
        ledger, ledger_lock = ReplicaLedger(), threading.Lock()
        collector = EventCollector(kv_channels, ledger, ledger_lock, unix_times.to_trace).start()
        done = [0]
        done_lock = threading.Lock()

        def finished(record: RequestRecord) -> None:
            with done_lock:
                done[0] += 1
                count = done[0]
            on_progress(len(requests), count, record)

        router_box: list[ReferenceRouter] = []
        engines = LiveEngines(engine_map, TraceClock(times), scheduler_channel,
                              lambda events: router_box[0].on_engine_events(events), config.heartbeat_interval_s)
        reporter = TurnEndReporter(predictor_channel, unix_times.to_clock) if turn_ends else None
        router = ReferenceRouter(scheduler_channel, kv_channels, engines, config.profile, ledger, ledger_lock,
                                 setup.geometry.bytes_per_block, config.real_geometry.bytes_per_token,
                                 on_done=finished, jobs=jobs, turn_ends=reporter,
                                 migration_limit=events.migration_limit if events else DEFAULT_MIGRATION_LIMIT,
                                 client=RoutingClient(scheduler_channel, nodes=nodes, predictor=predictor_channel,
                                                      settings=CLIENT_SETTINGS))
        router_box.append(router)
        forecasts: list[tuple[float, str, float]] = []
        poller = _ForecastPoller(predictor_channel, config, unix_times, forecasts).start()
        engines.start()
        # kv_channels itself: a node added by an event gets its channel there, closed with the others.
        played = (LiveEvents(events, times, cluster, router, engines, scheduler_channel, kv_channels,
                             lambda address: grpc.insecure_channel(address, options=CHANNEL_OPTIONS),
                             lambda node: emulated_engine(config, node)).start() if events else None)
        started = time.monotonic()
        try:
            sent = replay_open_loop(requests, times, SleepWaiter(_Monotonic()), router.send)
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while router.pending() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            if played is not None:
                played.stop()
            poller.stop()
            engines.stop()
            router.close()
            collector.stop()
        if played is not None and played.error is not None:
            raise Unavailable(f"a node event failed: {played.error}")
        orders, stores, actions = _final_state(scheduler, played.alive_channels() if played else kv_channels,
                                               policy)
        with ledger_lock:
            totals = ledger.totals()
        for record in router.records:
            if not record.served and not record.error:
                record.error = "not finished before the drain timeout"
        return PolicyRun(policy, list(router.records), totals, orders, forecasts, time.monotonic() - started, sent,
                         warmed, dict(router.jobs), stores, list(played.outcomes) if played else [],
                         dict(played.lifetimes) if played else {n: (-math.inf, math.inf) for n in nodes}, actions)
    finally:
        for engine in engine_map.values():
            close = getattr(engine, "close", None)  # real engines' servers (vllm)
            if close is not None:
                close()
        for channel in (scheduler_channel, predictor_channel, *kv_channels.values()):
            channel.close()


def _final_state(scheduler: scheduler_pb2_grpc.SchedulerStub, kv_channels: Mapping[str, grpc.Channel], policy: str
                 ) -> tuple[dict[str, int], dict[str, kvstore_pb2.StatsResponse], dict[str, ActionStats]]:
    """Orders by state, every kvstore's stats, and the policy's speculative
    orders by action (issued from the slice's start: the policy is set after the warm start), after the drain."""
    state = scheduler.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=10.0)
    orders = {common_pb2.OrderState.Name(o.state).removeprefix("ORDER_STATE_"): o.count for o in state.orders}
    stores = {n: kvstore_pb2_grpc.KVStoreStub(c).GetStats(kvstore_pb2.StatsRequest(), timeout=10.0)
              for n, c in kv_channels.items()}
    actions = {a.action: action_stats_from_proto(a) for a in state.actions if a.policy == policy}
    return orders, stores, actions


class _Monotonic:
    def now(self) -> float:
        return time.monotonic()


class _ForecastPoller:
    """Every forecast_poll_s (wall), the top families' expected count at the configured horizon."""

    def __init__(self, channel: grpc.Channel, config: E2EConfig, unix_times: TimeMap,
                 out: list[tuple[float, str, float]]) -> None:
        self._stub = predictor_pb2_grpc.PredictorStub(channel)
        self._config, self._times, self._out = config, unix_times, out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="forecast-poller", daemon=True)

    def start(self) -> "_ForecastPoller":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        while not self._stop.wait(self._config.forecast_poll_s):
            try:
                reply = self._stub.Forecast(predictor_pb2.ForecastRequest(
                    horizons_s=[self._config.forecast_horizon_s], max_families=5), timeout=2.0)
            except grpc.RpcError:
                continue
            t = self._times.to_trace(reply.now_s) if reply.now_s else self._times.to_trace(SystemClock().now())
            for f in reply.forecasts:
                if f.horizons:
                    self._out.append((t, f.family, f.horizons[0].expected_count))
