"""The kvstore process: config, core, replication, scheduler agent, metrics,
the TCP data plane listener (transport tcp) and a gRPC server; shutdown ends
event streams, the data plane, maintenance and the agent.

Background threads (maintenance, and the agent when a scheduler is named)
start with the server, so a node registers only once it accepts calls.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Mapping

import grpc

from speckv.kernels.backend import Backend, NumpyBackend
from speckv.kernels.backend_choice import select_backend
from speckv.services.common.clock import Clock, SystemClock
from speckv.services.common.config import parse_config
from speckv.services.common.errors import Unavailable
from speckv.services.common.rpc.server import ServiceServer, serve_until_signal
from speckv.services.common.rpc.service_metrics import register_gauges
from speckv.services.common.rpc.telemetry import Telemetry, build_telemetry
from speckv.services.kvstore.agent import SchedulerAgent
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.kvstore.disk.medium import FileMedium
from speckv.services.kvstore.disk.records import record_bytes
from speckv.services.kvstore.disk.settings import check_disk
from speckv.services.kvstore.dataplane.listener import DataPlaneServer, UnauthLimits
from speckv.services.kvstore.dataplane.tcp_target import TcpReplicationTarget
from speckv.services.kvstore.token_bucket import TokenBucket, gbit_to_bytes_per_s
from speckv.services.kvstore.grpc_target import GrpcReplicationTarget
from speckv.services.kvstore.nixl.agent import NixlAgent
from speckv.services.kvstore.nixl.endpoint import NixlEndpoint
from speckv.services.kvstore.nixl.landing import NixlLanding
from speckv.services.kvstore.nixl.target import NixlPeers, NixlReplicationTarget
from speckv.services.kvstore.peers import RegisteredPeers, RegistryFetch
from speckv.services.kvstore.replication import Replicator, TargetFactory
from speckv.services.kvstore.servicer import KVStoreServicer, RequestLimits
from speckv.services.kvstore.records import StoreStats, TierStats
from speckv.services.kvstore.shm.backend import SharedMemoryBackend
from speckv.services.kvstore.shm_target import SharedPoolsCache, ShmReplicationTarget
from speckv.services.kvstore.store import KVStoreCore
from speckv.services.kvstore.store_disk import DiskSettings
from speckv.services.kvstore.vllm_publisher import VllmEventPublisher
from speckv.services.kvstore.write_gate import WriteGate
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc

SERVICE = "kvstore"
SERVICE_NAME = kvstore_pb2.DESCRIPTOR.services_by_name["KVStore"].full_name
MAINTENANCE_S = 1.0  # how often lapsed reservations and pin leases are ended at the latest


def build_core(config: KVStoreConfig, clock: Clock) -> KVStoreCore:
    return KVStoreCore(config.node_id, config.kv_geometry(), config.device_pages, clock,
                       event_retention=config.event_retention,
                       backend=_pool_backend(config, config.backend, config.node_id),
                       host_pages=config.host_pages,
                       host_backend=_pool_backend(config, "numpy", f"{config.node_id}-host") if config.host_pages else None,
                       retain_max_share=config.retain_max_share, disk=_disk_settings(config))


def _disk_settings(config: KVStoreConfig) -> DiskSettings | None:
    """The disk tier under --disk-dir (its file re-indexed by the core), None without one."""
    bytes_per_block = config.kv_geometry().bytes_per_block
    slots = check_disk(config, bytes_per_block)
    if not slots:
        return None
    medium = FileMedium(Path(config.disk_dir), slots, record_bytes(bytes_per_block))
    return DiskSettings(medium, request_bytes=config.disk_request_kib * 1024, depth=config.disk_depth,
                        queue_blocks=config.disk_queue_blocks)


def _pool_backend(config: KVStoreConfig, choice: str, label: str) -> Backend:
    """The pool's memory: shared (shm/backend.py) where it is plain host
    memory and config.shared_memory is on; what select_backend gives otherwise
    (a GPU pool, or pinned host memory beside one)."""
    backend = select_backend(choice)
    if config.shared_memory and isinstance(backend, NumpyBackend) and not backend.pinned:
        return SharedMemoryBackend(label)
    return backend


def build_server(config: KVStoreConfig, telemetry: Telemetry, clock: Clock | None = None) -> ServiceServer:
    clock = clock or SystemClock()
    store = build_core(config, clock)
    nixl = NixlEndpoint(store, config.nixl)
    transports = build_transports(config, telemetry, clock, lambda: nixl.source_agent)
    # data_plane_auth: the gate mints and checks write capabilities; peers keeps replicas to registered nodes.
    agent: SchedulerAgent | None = None
    gate = WriteGate(config.node_id, clock, config.capability_ttl_s) if config.protected else None
    peers = RegisteredPeers(_registry_of(lambda: agent) if config.scheduler else None, clock) \
        if config.protected else None
    replicator = Replicator(store, transports[config.transport], clock, chunk_bytes=config.chunk_bytes,
                            reservation_lease_s=config.reservation_lease_s, transports=transports, peers=peers)
    data_plane = DataPlaneServer(store, config.host, config.data_port, config.node_id,
                                 max_connections=config.data_max_connections,
                                 read_timeout_s=config.data_read_timeout_s, gate=gate,
                                 unauth=UnauthLimits(config.data_unauth_max_connections,
                                                     config.data_unauth_per_address, config.data_auth_timeout_s)) \
        if config.transport in ("auto", "nixl", "tcp") else None
    kv_events = config.kv_events_settings()  # binds now: a taken port fails the start, not a later thread
    publisher = VllmEventPublisher(store, kv_events, config.node_id) if kv_events is not None else None
    stopping = threading.Event()
    limits = RequestLimits(config.max_reservation_lease_s, config.pin_lease_s, config.max_family_chars)
    servicer = KVStoreServicer(store, replicator, stopping, config.reservation_lease_s,
                               data_address=_data_address(config, data_plane), limits=limits, gate=gate,
                               nixl=lambda: nixl.agent, landing=lambda: nixl.landing,
                               order_counters=lambda: agent.order_counters() if agent is not None else {})

    def register(server: grpc.Server) -> list[str]:
        kvstore_pb2_grpc.add_KVStoreServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    server = ServiceServer(SERVICE, config, telemetry, register)
    _register_metrics(telemetry, store, data_plane, replicator, lambda: nixl.landing)
    maintenance = threading.Thread(target=_maintain, args=(store, stopping), name=f"{config.node_id}-maintenance",
                                   daemon=True)
    if config.scheduler:
        agent = SchedulerAgent(store, replicator, config.scheduler, config.advertise_address or server.address,
                               telemetry, heartbeat_interval_s=config.heartbeat_interval_s,
                               timeout_s=config.peer_timeout_s, tls=server.tls)

    def start() -> None:
        nixl.start()
        if data_plane is not None:
            data_plane.start()
        maintenance.start()
        if publisher is not None:
            publisher.start()
        if agent is not None:
            agent.start()

    def stop() -> None:
        stopping.set()
        store.close()
        if publisher is not None:
            publisher.stop(config.grace_s)
        if data_plane is not None:
            data_plane.stop()
        if agent is not None:
            agent.stop()
        if maintenance.is_alive():
            maintenance.join(timeout=config.grace_s)
        nixl.stop()

    server.on_start(start)
    server.on_stop(stop)
    return server


def build_transports(config: KVStoreConfig, telemetry: Telemetry, clock: Clock,
                     nixl: Callable[[], NixlAgent | None] = lambda: None) -> dict[str, TargetFactory]:
    """Name -> factory of the per-order target; all share the node's link cap.
    auto (and shm): shared memory on this host, else NIXL where both ends
    have an agent, else TCP; nixl: NIXL, else TCP."""
    bucket = TokenBucket(gbit_to_bytes_per_s(config.link_gbps), clock) if config.link_gbps > 0 else None

    tls = config.tls()

    def grpc_target(address: str) -> GrpcReplicationTarget:
        return GrpcReplicationTarget(address, telemetry, timeout_s=config.peer_timeout_s,
                                     max_message_bytes=config.max_message_bytes, bucket=bucket, tls=tls)

    def tcp_target(address: str) -> TcpReplicationTarget:
        return TcpReplicationTarget(grpc_target(address), timeout_s=config.peer_timeout_s, bucket=bucket)

    shared_pools = SharedPoolsCache()
    nixl_peers = NixlPeers()

    def over_nixl(control: GrpcReplicationTarget) -> NixlReplicationTarget:
        fallback = TcpReplicationTarget(control, timeout_s=config.peer_timeout_s, bucket=bucket)
        return NixlReplicationTarget(control, fallback, nixl_peers, nixl, bucket, batch_bytes=config.nixl_batch_bytes)

    def nixl_target(address: str) -> NixlReplicationTarget:
        """NIXL when both ends have an agent, else TCP."""
        return over_nixl(grpc_target(address))

    def shm_target(address: str) -> ShmReplicationTarget:
        """Shared memory when the target shares its pools with this process, else NIXL, else TCP."""
        control = grpc_target(address)
        return ShmReplicationTarget(control, over_nixl(control), shared_pools, bucket)

    return {"auto": shm_target, "shm": shm_target, "nixl": nixl_target, "tcp": tcp_target, "grpc": grpc_target}


def _registry_of(agent: Callable[[], SchedulerAgent | None]) -> RegistryFetch:
    """The scheduler's registry through the agent built after the replicator."""
    def fetch() -> dict[str, str]:
        current = agent()
        if current is None:
            raise Unavailable("scheduler registry: the agent is not started yet")
        return current.registered_nodes()
    return fetch


def _data_address(config: KVStoreConfig, data_plane: DataPlaneServer | None) -> str:
    """host:port peers send chunks to: the advertised host, else the bound one."""
    if data_plane is None:
        return ""
    host = config.advertise_address.rpartition(":")[0] if config.advertise_address else ""
    return data_plane.address(host)


def _maintain(store: KVStoreCore, stopping: threading.Event) -> None:
    while not stopping.wait(MAINTENANCE_S):
        store.maintenance()


Observations = list[tuple[float, dict[str, str]]]
PAGE_STATES = ("used", "free", "pinned", "reserved", "replica", "evictable")  # TierStats' <state>_pages
BLOCK_TOTALS = ("stored", "evicted", "committed", "demoted", "promoted", "dropped")  # blocks_<kind>_total


def _tiers(stats: StoreStats) -> list[tuple[str, TierStats]]:
    """(tier name, its stats): the device tier, then the host and disk tiers the node has."""
    return [("device", stats.device), *([("host", stats.host)] if stats.host is not None else []),
            *([("disk", stats.disk)] if stats.disk is not None else [])]


def tier_pages(stats: StoreStats) -> Observations:
    """Pages of each (tier, state); every point names the node, so one
    dashboard query draws each node's pool. A page of a block held in both
    tiers counts in each."""
    return [(float(getattr(tier, f"{state}_pages")), {"node": stats.node_id, "tier": name, "state": state})
            for name, tier in _tiers(stats) for state in PAGE_STATES]


def tier_occupancy(stats: StoreStats) -> Observations:
    """Used pages / pages, 0..1, per tier."""
    return [(tier.used_pages / tier.num_pages if tier.num_pages else 0.0, {"node": stats.node_id, "tier": name})
            for name, tier in _tiers(stats)]


def block_totals(stats: StoreStats) -> Observations:
    """Blocks stored, evicted, ... since start (cumulative, never decrease)."""
    return [(float(getattr(stats, f"blocks_{kind}_total")), {"node": stats.node_id, "kind": kind})
            for kind in BLOCK_TOTALS]


def data_plane_refusals(node_id: str, data_plane: DataPlaneServer) -> Observations:
    """Data plane connections ended unserved since start, by cause
    (ConnectionCounts: refused_slots, refused_per_address, refused_full,
    displaced, timed_out, denied); cumulative, never decrease."""
    return [(float(count), {"node": node_id, "cause": cause}) for cause, count in data_plane.counts().as_dict().items()]


def nixl_batches(node_id: str, landing: NixlLanding | None) -> Observations:
    """NIXL batches this node checked as they landed, passed or refused, since
    its agent started (none without one)."""
    if landing is None:
        return []
    return [(float(landing.checked), {"node": node_id, "outcome": "checked"}),
            (float(landing.refused), {"node": node_id, "outcome": "refused"})]


def data_plane_connections(node_id: str, data_plane: DataPlaneServer) -> Observations:
    """Data plane connections now: served (verified), waiting (not yet) and
    held (refused, kept open until their deadline)."""
    return [(float(data_plane.open_connections), {"node": node_id, "state": "served"}),
            (float(data_plane.waiting_connections), {"node": node_id, "state": "waiting"}),
            (float(data_plane.held_connections), {"node": node_id, "state": "held"})]


def _register_metrics(telemetry: Telemetry, store: KVStoreCore, data_plane: DataPlaneServer | None,
                      replicator: Replicator, landing: Callable[[], NixlLanding | None] = lambda: None) -> None:
    gauges = {
        # Copies this node sent as a source, and their bytes, per data plane and outcome (cumulative).
        "speckv.kvstore.replications": lambda: [
            (float(n), {"node": store.node_id, "transport": t or "none", "outcome": o})
            for (t, o), (n, _) in sorted(replicator.carried().items())],
        "speckv.kvstore.replication_bytes": lambda: [
            (float(b), {"node": store.node_id, "transport": t or "none", "outcome": o})
            for (t, o), (_, b) in sorted(replicator.carried().items())],
        "speckv.kvstore.pages": lambda: tier_pages(store.stats()),
        "speckv.kvstore.pool.occupancy": lambda: tier_occupancy(store.stats()),
        "speckv.kvstore.blocks": lambda: block_totals(store.stats()),
        "speckv.kvstore.events.last_sequence": lambda: [(float(store.stats().last_event_sequence),
                                                         {"node": store.node_id})],
        # NIXL batches written into this node, checked as they landed: passed or refused (cumulative).
        "speckv.kvstore.nixl.batches": lambda: nixl_batches(store.node_id, landing()),
    }
    if data_plane is not None:
        gauges["speckv.kvstore.dataplane.refused"] = lambda: data_plane_refusals(store.node_id, data_plane)
        gauges["speckv.kvstore.dataplane.connections"] = lambda: data_plane_connections(store.node_id, data_plane)
    register_gauges(telemetry.meter_provider, SERVICE, gauges)


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    config = parse_config(KVStoreConfig, argv, environ, prog="speckv kvstore")
    telemetry = build_telemetry(SERVICE, environ)
    return serve_until_signal(build_server(config, telemetry))
