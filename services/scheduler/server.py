"""Scheduler server: wires the core to gRPC, KV event streams, the predictor
feed and the policy ticker, and stops them all on shutdown."""
from __future__ import annotations

import threading
from typing import Mapping

from speckv.services.common.clock import Clock, SystemClock
from speckv.services.common.config import parse_config
from speckv.services.common.metrics import register_gauges
from speckv.services.common.server import ServiceServer, serve_until_signal
from speckv.services.common.telemetry import Telemetry, build_telemetry
from speckv.services.scheduler.arrivals import ArrivalReporter
from speckv.services.scheduler.config import SchedulerConfig
from speckv.services.scheduler.core import CoreSettings, SchedulerCore
from speckv.services.scheduler.engine_profile import get_profile
from speckv.services.scheduler.event_sync import EventSync
from speckv.services.scheduler.ids import NodeId
from speckv.services.scheduler.remote import KVStoreConfirmer, PredictorSender
from speckv.services.scheduler.servicer import SchedulerServicer
from speckv.services.scheduler.ticker import Ticker
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name


class _NodeWiring:
    """Restarts a node's KV event stream and drops its old Lookup channel
    whenever it (re-)registers."""

    def __init__(self, confirmer: KVStoreConfirmer) -> None:
        self.confirmer = confirmer
        self.event_sync: EventSync | None = None

    def node_registered(self, node_id: NodeId, address: str, generation: int, old_address: str | None) -> None:
        if old_address and old_address != address:
            self.confirmer.forget(old_address)
        if self.event_sync is not None:
            self.event_sync.follow(node_id, address, generation)


def core_settings(config: SchedulerConfig) -> CoreSettings:
    return CoreSettings(node_timeout_s=config.node_timeout_s, heartbeat_interval_ms=config.heartbeat_interval_ms,
                        policy=config.policy, link_gbps=config.link_gbps, link_overhead_ms=config.link_overhead_ms,
                        router_seed=config.router_seed, tie_ms=config.tie_ms)


def build_server(config: SchedulerConfig, telemetry: Telemetry, clock: Clock | None = None) -> ServiceServer:
    clock = clock or SystemClock()
    profile = get_profile(config.engine_profile, config.engine_profiles_path or None)
    confirmer = KVStoreConfirmer(telemetry, config.lookup_timeout_s)
    sender = PredictorSender(config.predictor, telemetry, config.predictor_timeout_s) if config.predictor else None
    reporter = ArrivalReporter(sender, capacity=config.arrival_queue) if sender else None
    wiring = _NodeWiring(confirmer)
    core = SchedulerCore(core_settings(config), clock, profile, confirmer=confirmer, arrivals=reporter,
                         listener=wiring)
    wiring.event_sync = event_sync = EventSync(core.apply_kv_event, core.reset_inventory, telemetry)
    stopping = threading.Event()
    servicer = SchedulerServicer(core, stopping)

    def register(server) -> list[str]:
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    server = ServiceServer("scheduler", config, telemetry, register)
    ticker = Ticker(config.tick_s, core.tick)

    def start() -> None:
        ticker.start()
        if reporter is not None:
            reporter.start()

    def stop() -> None:
        stopping.set()
        core.close()
        ticker.stop()
        event_sync.stop_all()
        if reporter is not None:
            reporter.stop()
        if sender is not None:
            sender.close()
        confirmer.close()

    server.on_start(start)
    server.on_stop(stop)
    register_gauges(telemetry.meter_provider, "scheduler", {
        "speckv.scheduler.orders": lambda: [(float(n), {"state": s.name.lower()})
                                            for s, n in core.order_counts().items()],
        "speckv.scheduler.live_nodes": lambda: [(float(core.live_node_count()), {})],
        "speckv.scheduler.arrivals_dropped": lambda: [] if reporter is None else [
            (float(reporter.stats().dropped_full), {"reason": "queue_full"}),
            (float(reporter.stats().dropped_send), {"reason": "predictor_down"})],
    })
    return server


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    config = parse_config(SchedulerConfig, argv, environ, prog="speckv scheduler")
    telemetry = build_telemetry("scheduler", environ)
    return serve_until_signal(build_server(config, telemetry))
