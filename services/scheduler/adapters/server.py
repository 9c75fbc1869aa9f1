"""Scheduler server: wires the core to gRPC, KV event streams (kvstores' and
vLLM engines'), the predictor feed and the policy ticker, and stops them all
on shutdown."""
from __future__ import annotations

import threading
from typing import Callable, Mapping, Sequence

from speckv.services.common.clock import Clock, SystemClock
from speckv.services.common.config import parse_config
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import FailedPrecondition, SpeckvError
from speckv.services.common.ids import NodeId
from speckv.services.common.rpc.server import ServiceServer, serve_until_signal
from speckv.services.common.rpc.service_metrics import register_gauges
from speckv.services.common.rpc.telemetry import Telemetry, build_telemetry
from speckv.services.common.traces.mooncake import load_mooncake
from speckv.services.scheduler.adapters.compiled_start import restart_compiled
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.event_sync import EventSync
from speckv.services.scheduler.adapters.merged_sources import EngineAwareConfirm, EngineSourceSink, KVStoreEvents
from speckv.services.scheduler.adapters.replica_role import ReplicaRole
from speckv.services.scheduler.adapters.replica_setup import ReplicaSetup
from speckv.services.scheduler.adapters.remote import KVStoreConfirmer, PredictorForecastSources, PredictorSender
from speckv.services.scheduler.adapters.servicer import RequestLimits, SchedulerServicer
from speckv.services.scheduler.adapters.state_store import StateStore
from speckv.services.scheduler.adapters.ticker import Ticker
from speckv.services.scheduler.adapters.vllm_spec import parse_kv_events
from speckv.services.scheduler.adapters.vllm_subscriber import VllmEventFeeds
from speckv.services.scheduler.arrival_reports import ArrivalReporter
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.forecasts import TraceFutureArrivals
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.source_merge import SourceMerge
from speckv.services.scheduler.ports import PrefixConfirmer, SchedulerSettings
from speckv.services.scheduler.orders import ActionKind
from speckv.services.scheduler.replication.outcomes import ActionStats
from speckv.services.scheduler.replication.replicas import ReplicaStats
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name


class _NodeWiring:
    """Restarts a node's KV event stream and drops its old Lookup channel
    whenever it (re-)registers. A vLLM-fed node (--kv-events, at its
    configured address) has no kvstore to stream from: its feed is its own."""

    def __init__(self, confirmer: KVStoreConfirmer, vllm_nodes: Mapping[NodeId, str],
                 engine_confirm: EngineAwareConfirm | None = None) -> None:
        self.confirmer = confirmer
        self.event_sync: EventSync | None = None
        self.vllm_nodes = vllm_nodes
        self.engine_confirm = engine_confirm

    def node_registered(self, node_id: NodeId, address: str, generation: int, old_address: str | None) -> None:
        if old_address and old_address != address:
            self.confirmer.forget(old_address)
        if self.engine_confirm is not None:
            self.engine_confirm.registered(node_id, address)
        if self.event_sync is not None and self.vllm_nodes.get(node_id) != address:
            self.event_sync.follow(node_id, address, generation)


class _SkipVllmConfirm:
    """Route's confirming Lookup, except at vLLM-fed nodes' addresses, which
    have no kvstore to ask: their prefixes stand on the index alone."""

    def __init__(self, confirmer: KVStoreConfirmer, vllm_addresses: Sequence[str]) -> None:
        self._confirmer, self._skip = confirmer, frozenset(vllm_addresses)

    def asks(self, address: str) -> bool:
        return address not in self._skip

    def confirm(self, address: str, block_hashes: Sequence[int]) -> int | None:
        return self._confirmer.confirm(address, block_hashes)


class _LossRule:
    """What the scheduler does when a node's kvstore is seen gone
    (event_sync.py's loss rule): SchedulerCore.node_lost, unless the node
    registered again meanwhile (a newer generation is alive and is not the
    process that went away)."""

    def __init__(self, core: SchedulerCore) -> None:
        self._core = core

    def node_lost(self, node_id: NodeId, generation: int, reason: str) -> None:
        self._core.node_lost(node_id, reason, generation)  # checked and acted on under the core's lock


def core_settings(config: SchedulerConfig) -> SchedulerSettings:
    return SchedulerSettings(node_timeout_s=config.node_timeout_s, heartbeat_interval_ms=config.heartbeat_interval_ms,
                        policy=config.policy, link_gbps=config.link_gbps, link_overhead_ms=config.link_overhead_ms,
                        host_link_gbps=config.host_link_gbps, host_link_overhead_ms=config.host_link_overhead_ms,
                        disk_gbps=config.disk_gbps, disk_overhead_ms=config.disk_overhead_ms,
                        router_seed=config.router_seed, tie_ms=config.tie_ms,
                        policy_config=load_policy_config(config.policies_path or None))


def future_arrivals(config: SchedulerConfig) -> TraceFutureArrivals | None:
    """The oracle's true future, from --oracle-trace shifted by --oracle-offset-s,
    its families keyed by --oracle-family (the routers' keying: a count for a
    family nobody routes is demand the planner can never place)."""
    if not config.oracle_trace:
        return None
    return TraceFutureArrivals(load_mooncake(config.oracle_trace, family=config.oracle_family),
                               config.oracle_offset_s)


def build_server(config: SchedulerConfig, telemetry: Telemetry, clock: Clock | None = None,
                 inventory: Callable[[SchedulerCore], None] | None = None) -> ServiceServer:
    """The scheduler server. `inventory`, when given, fills the core's nodes
    and block index before serving *instead of* the kvstores' event streams
    (benchmarks of a synthetic cluster whose nodes do not exist). With
    --state-dir the core journals its control state there and resumes from
    it; an unusable database fails here (FailedPrecondition), before serving."""
    clock = clock or SystemClock()
    tls = config.tls()  # the scheduler's own certificate on its calls to kvstores and the predictor too
    replicas = ReplicaSetup(config, telemetry, tls) if config.etcd else None
    store = StateStore.open(config.state_dir) if config.state_dir else None
    saved = store.load() if store is not None else None
    profile = get_profile(config.engine_profile, config.engine_profiles_path or None)
    confirmer = KVStoreConfirmer(telemetry, config.lookup_timeout_s, tls)
    sender = (PredictorSender(config.predictor, telemetry, config.predictor_timeout_s, tls)
              if config.predictor else None)
    settings = core_settings(config)
    forecasts = (PredictorForecastSources(config.predictor, telemetry, settings.policy_config,
                                          config.forecast_timeout_s, tls) if config.predictor else None)
    reporter = ArrivalReporter(sender, capacity=config.arrival_queue) if sender else None
    vllm_specs = parse_kv_events(config.kv_events)
    engine_only = [s for s in vllm_specs if not s.kvstore]  # engines with no kvstore: their feed is the node's
    confirm: PrefixConfirmer = (_SkipVllmConfirm(confirmer, [s.route_address for s in engine_only])
                                if engine_only else confirmer)
    engine_confirm = EngineAwareConfirm(confirm) if len(engine_only) < len(vllm_specs) else None
    wiring = _NodeWiring(confirmer, {NodeId(s.node_id): s.route_address for s in engine_only}, engine_confirm)
    core = SchedulerCore(settings, clock, profile,
                         confirmer=(engine_confirm or confirm) if config.confirm_routes else None, arrivals=reporter,
                         listener=wiring, forecasts=forecasts, future=future_arrivals(config),
                         state=replicas.journal if replicas is not None else store)
    lost = _LossRule(core)
    merge = SourceMerge(core, [NodeId(s.node_id) for s in vllm_specs if s.kvstore])
    if engine_confirm is not None:
        engine_confirm.bind(merge)
    kvstore_events = KVStoreEvents(core, merge)
    event_sync = EventSync(kvstore_events.apply_kv_event, kvstore_events.reset_inventory, telemetry, tls=tls,
                           lost=lost.node_lost if config.loss_probe_s > 0 else None,
                           probe_s=config.loss_probe_s or 1.0)
    vllm_feeds = VllmEventFeeds(vllm_specs, core, profile.geometry.block_size,
                                config.heartbeat_interval_ms / 1000.0,
                                beside_kvstore=EngineSourceSink(merge),
                                health_rule=config.engine_health()) if vllm_specs else None
    if inventory is not None:
        inventory(core)
    else:
        wiring.event_sync = event_sync
    if store is not None and saved is not None:
        try:
            core.restore(saved)  # after the wiring: restored nodes' event streams start here
        except SpeckvError as exc:
            store.close()
            raise FailedPrecondition(f"state database {store.path}: cannot resume from it: {exc}") from None
    stopping = threading.Event()
    role = replicas.role if replicas is not None else ReplicaRole()
    servicer = SchedulerServicer(core, stopping, RequestLimits(config.max_prompt_tokens, config.max_family_chars),
                                 on_failed_order=event_sync.suspect if config.loss_probe_s > 0 else None,
                                 role=role, on_routed=replicas.share if replicas is not None else None)

    def register(server) -> list[str]:
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    server = ServiceServer("scheduler", config, telemetry, register)
    if replicas is not None:
        replicas.attach(core, server.address)
    # A replica that does not lead sweeps liveness and leases but plans nothing.
    ticker = Ticker(config.tick_s, lambda: core.tick(plan=role.is_leader()))

    def start() -> None:
        ticker.start()
        if replicas is not None:
            replicas.start()
        if reporter is not None:
            reporter.start()
        if vllm_feeds is not None:
            vllm_feeds.start()

    def stop() -> None:
        stopping.set()
        if replicas is not None:
            replicas.stop()  # resigns first: another replica leads at once
        core.close()
        ticker.stop()
        event_sync.stop_all()
        if vllm_feeds is not None:
            vllm_feeds.stop()
        if reporter is not None:
            reporter.stop()
        if sender is not None:
            sender.close()
        if forecasts is not None:
            forecasts.close()
        confirmer.close()
        if store is not None:
            store.close()

    server.on_start(start)
    server.on_stop(stop)
    register_gauges(telemetry.meter_provider, "scheduler", {
        "speckv.scheduler.orders": lambda: [(float(n), {"state": s.name.lower()})
                                            for s, n in core.order_counts().items()],
        "speckv.scheduler.live_nodes": lambda: [(float(core.live_node_count()), {})],
        "speckv.scheduler.leading": lambda: [(1.0 if role.is_leader() else 0.0, {"epoch": str(role.epoch())})],
        "speckv.scheduler.replicas": lambda: _replica_gauges(core),
        "speckv.scheduler.replica_bytes": lambda: replica_bytes(core.cluster_state().replicas),
        "speckv.scheduler.action.orders": lambda: action_orders(core.action_outcomes()),
        "speckv.scheduler.action.bytes": lambda: action_bytes(core.action_outcomes()),
        "speckv.scheduler.action.bytes_read_after_lease": lambda: action_bytes_read_after_lease(
            core.action_outcomes()),
        "speckv.scheduler.action.bytes_by_forecast": lambda: action_bytes_by_forecast(core.action_outcomes()),
        "speckv.scheduler.arrivals_dropped": lambda: [] if reporter is None else [
            (float(reporter.stats().dropped_full), {"reason": "queue_full"}),
            (float(reporter.stats().dropped_send), {"reason": "predictor_down"})],
        "speckv.scheduler.vllm_events_skipped": lambda: [] if vllm_feeds is None else [
            (float(n), {"node": node, "reason": reason})
            for node, stats in vllm_feeds.stats().items() for reason, n in stats.skipped.items()],
        "speckv.scheduler.vllm_catch_ups": lambda: [] if vllm_feeds is None else [
            (float(n), {"node": node, "outcome": outcome}) for node, stats in vllm_feeds.stats().items()
            for outcome, n in (("replayed", stats.replays), ("reset", stats.resets))],
        "speckv.scheduler.vllm_engine_health": lambda: [] if vllm_feeds is None else [
            (float(n), {"node": node, "transition": transition}) for node, stats in vllm_feeds.stats().items()
            for transition, n in (("died", stats.deaths), ("revived", stats.revivals))],
    })
    return server


Observations = list[tuple[float, dict[str, str]]]
PENDING = "pending"  # issued, no outcome yet (outcomes.py)


def _replica_gauges(core: SchedulerCore) -> Observations:
    stats = core.cluster_state().replicas
    return [(float(stats.committed), {"outcome": "committed"}), (float(stats.kept), {"outcome": "kept"}),
            (float(stats.released_unused), {"outcome": "released_unused"})]


def replica_bytes(stats: ReplicaStats) -> Observations:
    """Bytes of committed replicas since start, and of those whose lease ended
    unused (wasted, a subset); cumulative, as GetClusterState reports them."""
    return [(float(stats.bytes_committed), {"kind": "replicated"}), (float(stats.bytes_wasted), {"kind": "wasted"})]


def action_orders(stats: Mapping[tuple[str, ActionKind], ActionStats]) -> Observations:
    """Orders per (policy, action, outcome) since start; `pending` ones have
    no outcome yet, so the outcomes of a (policy, action) sum to its orders."""
    return _by_outcome(stats, lambda s: s.orders, lambda s: s.outcomes)


def action_bytes(stats: Mapping[tuple[str, ActionKind], ActionStats]) -> Observations:
    """The same split of the orders' bytes (outcomes.py says which bytes an
    order counts and when); `pending`: counted, not yet decided."""
    return _by_outcome(stats, lambda s: s.bytes, lambda s: s.bytes_by_outcome)


def action_bytes_read_after_lease(stats: Mapping[tuple[str, ActionKind], ActionStats]) -> Observations:
    """Bytes of orders used late or never used that a later request found on
    their node after their lease (outcomes.py); a part of those two outcomes'."""
    return [(float(s.bytes_read_after_lease), {"policy": policy, "action": action.value})
            for (policy, action), s in sorted(stats.items(), key=lambda item: (item[0][0], item[0][1].value))]


def action_bytes_by_forecast(stats: Mapping[tuple[str, ActionKind], ActionStats]) -> Observations:
    """action_bytes split by the forecast the orders were bought for
    (`forecast`: burst, return, retention, or none); its forecasts sum to it."""
    rows: Observations = []
    for (policy, action), s in sorted(stats.items(), key=lambda item: (item[0][0], item[0][1].value)):
        for forecast, part in sorted(s.by_forecast.items()):
            labels = {"policy": policy, "action": action.value, "forecast": forecast or "none"}
            rows += _outcome_rows(labels, part.bytes, part.bytes_by_outcome)
    return rows


def _by_outcome(stats: Mapping[tuple[str, ActionKind], ActionStats], total: Callable[[ActionStats], int],
                by_outcome: Callable[[ActionStats], Mapping[str, int]]) -> Observations:
    rows: Observations = []
    for (policy, action), s in sorted(stats.items(), key=lambda item: (item[0][0], item[0][1].value)):
        rows += _outcome_rows({"policy": policy, "action": action.value}, total(s), by_outcome(s))
    return rows


def _outcome_rows(labels: dict[str, str], total: int, decided: Mapping[str, int]) -> Observations:
    """One row per outcome, and `pending` for what has none yet."""
    rows: Observations = [(float(n), {**labels, "outcome": outcome}) for outcome, n in decided.items()]
    rows.append((float(total - sum(decided.values())), {**labels, "outcome": PENDING}))
    return rows


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    config = parse_config(SchedulerConfig, argv, environ, prog="speckv scheduler")
    restart_compiled(config.compiled, config.compiled_dir, argv, environ)  # may replace this process
    telemetry = build_telemetry("scheduler", environ)
    return serve_until_signal(build_server(config, telemetry))
