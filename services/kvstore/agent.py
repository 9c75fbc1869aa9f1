"""The node's link to the scheduler (gRPC; not core).

- registers (node id, advertised address, capacity, geometry), then
  heartbeats every interval (the scheduler's, if its registration reply names
  one, else the configured one) and re-registers when a heartbeat is answered
  known=false;
- watches WatchOrders(node_id); each order runs on a small pool: report
  IN_FLIGHT, replicate to order.target_address, report COMMITTED or FAILED
  with the message, bytes and blocks;
- a failed call or a broken stream is retried after a capped exponential
  backoff (0.2 s doubling to 5 s, reset by the next success);
- stop() ends both loops at once (the order stream is cancelled) and does not
  wait for orders in flight (their calls carry deadlines).

free_pages in heartbeats is what a replica could get without touching pinned
or reserved blocks: free plus evictable pages. A full pool of cold cache is
room for the planner, not a full node.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import grpc

from speckv.services.common.errors import SpeckvError, Unavailable
from speckv.services.common.rpc.geometry_proto import geometry_to_proto
from speckv.services.common.rpc.server import open_channel
from speckv.services.common.rpc.telemetry import Telemetry
from speckv.services.common.rpc.tls import TlsMaterial
from speckv.services.kvstore.replication import ReplicationResult, Replicator, TransferOutcome
from speckv.services.kvstore.servicer import order_from_proto
from speckv.services.kvstore.store import KVStoreCore
from speckv.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)
ORDER_WORKERS = 2


class Backoff:
    """Capped exponential delays: first, first*2, ... up to cap."""

    def __init__(self, first_s: float = 0.2, cap_s: float = 5.0) -> None:
        self._first, self._cap, self._next = first_s, cap_s, first_s

    def reset(self) -> None:
        self._next = self._first

    def next(self) -> float:
        delay, self._next = self._next, min(self._cap, self._next * 2)
        return delay


class SchedulerAgent:
    def __init__(self, store: KVStoreCore, replicator: Replicator, scheduler_address: str, advertise_address: str,
                 telemetry: Telemetry | None, *, heartbeat_interval_s: float = 1.0, timeout_s: float = 10.0,
                 tls: TlsMaterial | None = None) -> None:
        self._store = store
        self._replicator = replicator
        self._address = advertise_address
        self._interval_s = heartbeat_interval_s
        self._timeout_s = timeout_s
        self._channel = open_channel(scheduler_address, telemetry, tls=tls, peer_role="scheduler")
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watch_call: grpc.Future | None = None
        self._cancelled = CancelledOrders()
        self._orders = ThreadPoolExecutor(ORDER_WORKERS, thread_name_prefix=f"{store.node_id}-order")
        self._threads = [threading.Thread(target=self._heartbeat_loop, name=f"{store.node_id}-heartbeat", daemon=True),
                         threading.Thread(target=self._watch_loop, name=f"{store.node_id}-orders", daemon=True)]
        self.registrations = 0  # successful RegisterNode calls (for tests and logs)

    def start(self) -> "SchedulerAgent":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            cancel = getattr(self._watch_call, "cancel", None)  # instrumented streams may lack it
        if cancel is not None:
            cancel()
        self._channel.close()  # ends every call still open on it, the order stream included
        self._orders.shutdown(wait=False, cancel_futures=True)
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=self._timeout_s)

    # ---- registration and heartbeats -------------------------------------
    def _heartbeat_loop(self) -> None:
        backoff, registered, interval = Backoff(), False, self._interval_s
        while not self._stop.is_set():
            try:
                if not registered:
                    interval = self._register()
                    registered = True
                reply = self._stub.Heartbeat(self._heartbeat_request(), timeout=self._timeout_s)
                registered = reply.known
                delay = interval if registered else 0.0
                backoff.reset()
            except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed by stop()
                if self._stop.is_set():
                    return
                log.warning("scheduler heartbeat failed: %s", _describe(exc))
                delay = backoff.next()
            self._stop.wait(delay)

    def _register(self) -> float:
        stats = self._store.stats()
        reply = self._stub.RegisterNode(scheduler_pb2.RegisterNodeRequest(
            node_id=self._store.node_id, address=self._address, capacity_pages=stats.num_pages,
            geometry=geometry_to_proto(stats.geometry), host_pages=stats.host_pages,
            retain_max_blocks=stats.retain_max_blocks), timeout=self._timeout_s)
        self.registrations += 1
        log.info("registered %s at %s with the scheduler", self._store.node_id, self._address)
        return reply.heartbeat_interval_ms / 1000.0 if reply.heartbeat_interval_ms else self._interval_s

    def registered_nodes(self) -> dict[str, str]:
        """The scheduler's registry, node id -> registered address (peers.py
        caches it); Unavailable when the scheduler cannot be asked."""
        try:
            state = self._stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=self._timeout_s)
        except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed by stop()
            raise Unavailable(f"scheduler registry: {_describe(exc)}") from None
        return {node.node_id: node.address for node in state.nodes}

    def _heartbeat_request(self) -> scheduler_pb2.HeartbeatRequest:
        stats = self._store.stats()
        return scheduler_pb2.HeartbeatRequest(node_id=self._store.node_id, free_pages=stats.available_pages,
                                              retained_blocks=stats.retained_blocks)

    # ---- orders ----------------------------------------------------------
    def _watch_loop(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                call = self._stub.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id=self._store.node_id))
                with self._lock:
                    self._watch_call = call
                for order in call:
                    backoff.reset()
                    if order.cancelled:
                        self._cancelled.mark(order.order_id)
                    else:
                        self._orders.submit(self._execute, order)
            except (grpc.RpcError, ValueError, RuntimeError) as exc:  # RuntimeError: submit after stop()
                if self._stop.is_set():
                    return
                log.warning("order stream from the scheduler broke: %s", _describe(exc))
            self._stop.wait(backoff.next())

    def _execute(self, order: common_pb2.ReplicationOrder) -> None:
        # An order cancelled while it waited for a worker is dropped unreported:
        # the scheduler already counts it cancelled. One already sending runs on.
        if self._stop.is_set() or self._cancelled.contains(order.order_id):
            return
        if order.action not in ("", "replicate", "redundant", "prefetch", "retain"):
            # A newer scheduler's action this node cannot run: refuse it rather than copy.
            self._report(order.order_id, common_pb2.ORDER_STATE_FAILED, f"unknown order action {order.action!r}")
            return
        self._report(order.order_id, common_pb2.ORDER_STATE_IN_FLIGHT, "")
        try:
            result = (self._prefetch(order) if order.action == "prefetch"
                      else self._retain(order) if order.action == "retain"
                      # "replicate" and "redundant" copy alike: they differ only in why the planner chose them.
                      else self._replicator.replicate(order_from_proto(order)))
        except SpeckvError as exc:
            result = ReplicationResult(order.order_id, TransferOutcome.FAILED, message=str(exc), error=exc)
        except Exception as exc:  # noqa: BLE001 - a bug must still fail the order, not hang it
            log.exception("order %s crashed", order.order_id)
            result = ReplicationResult(order.order_id, TransferOutcome.FAILED, message=f"internal error: {exc}")
        state = (common_pb2.ORDER_STATE_COMMITTED if result.outcome is TransferOutcome.COMMITTED
                 else common_pb2.ORDER_STATE_FAILED)
        self._report(order.order_id, state, result.message, result.bytes_sent, result.blocks_sent, result.transport)

    def _prefetch(self, order: common_pb2.ReplicationOrder) -> ReplicationResult:
        """Promotes this node's host-only blocks of the order's prefix (the
        blocks never cross the network: bytes_sent stays 0)."""
        promoted = self._store.promote(list(order.block_hashes))
        return ReplicationResult(order.order_id, TransferOutcome.COMMITTED, blocks_sent=promoted,
                                 message=f"prefetched {promoted} blocks into the device tier")

    def _retain(self, order: common_pb2.ReplicationOrder) -> ReplicationResult:
        """Keeps the order's prefix on this node for its lease (nothing moves)."""
        retained = self._store.retain(list(order.block_hashes), order.lease_ms / 1e3)
        return ReplicationResult(order.order_id, TransferOutcome.COMMITTED, blocks_sent=retained,
                                 message=f"retained {retained} blocks for {order.lease_ms} ms")

    def _report(self, order_id: str, state: int, message: str, bytes_sent: int = 0, blocks_sent: int = 0,
                transport: str = "") -> None:
        """transport: the data plane that carried the order (shm, nixl, tcp, grpc; "" if none did)."""
        try:
            self._stub.ReportOrderStatus(scheduler_pb2.OrderStatusReport(
                order_id=order_id, state=state, message=message[:2000], bytes_sent=bytes_sent,
                blocks_sent=blocks_sent, transport=transport), timeout=self._timeout_s)
        except (grpc.RpcError, ValueError) as exc:
            log.warning("could not report order %s: %s", order_id, _describe(exc))


class CancelledOrders:
    """The ids of the last `capacity` orders the scheduler cancelled."""

    def __init__(self, capacity: int = 4096) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def mark(self, order_id: str) -> None:
        with self._lock:
            self._ids[order_id] = None
            self._ids.move_to_end(order_id)
            while len(self._ids) > self._capacity:
                self._ids.popitem(last=False)

    def contains(self, order_id: str) -> bool:
        with self._lock:
            return order_id in self._ids


def _describe(exc: Exception) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'error'}: {details}"
