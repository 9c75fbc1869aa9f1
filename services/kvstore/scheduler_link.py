"""One kvstore's link to one scheduler replica (gRPC; not core).

A kvstore has one link per scheduler replica it is given (`--scheduler`,
comma-separated): each registers, heartbeats and watches WatchOrders on its
own threads, so every replica knows the node, its load and its orders'
stream whichever replica leads. Only the leader streams orders; a follower's
stream stays open and quiet. Every reply's Leadership (its epoch) goes to the
agent's OrderFence.

- registers (node id, advertised address, capacity, geometry), then
  heartbeats every interval (the replica's, if its registration reply names
  one, else the configured one) and re-registers when a heartbeat is answered
  known=false;
- a failed call or a broken stream is retried after a capped exponential
  backoff (0.2 s doubling to 5 s, reset by the next success);
- close() ends both loops (the order stream is cancelled, the channel
  closed): the agent closes one link when its replica's address leaves DNS
  discovery, or every link when it stops.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import grpc

from speckv.services.common.rpc.geometry_proto import geometry_to_proto
from speckv.services.common.rpc.server import open_channel
from speckv.services.common.rpc.telemetry import Telemetry
from speckv.services.common.rpc.tls import TlsMaterial
from speckv.services.kvstore.store import KVStoreCore
from speckv.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

OrderSink = Callable[["SchedulerLink", common_pb2.ReplicationOrder], None]
EpochSink = Callable[[int], None]


class Backoff:
    """Capped exponential delays: first, first*2, ... up to cap."""

    def __init__(self, first_s: float = 0.2, cap_s: float = 5.0) -> None:
        self._first, self._cap, self._next = first_s, cap_s, first_s

    def reset(self) -> None:
        self._next = self._first

    def next(self) -> float:
        delay, self._next = self._next, min(self._cap, self._next * 2)
        return delay


class SchedulerLink:
    def __init__(self, store: KVStoreCore, address: str, advertise_address: str, telemetry: Telemetry | None,
                 on_order: OrderSink, on_epoch: EpochSink, *,
                 heartbeat_interval_s: float, timeout_s: float, tls: TlsMaterial | None) -> None:
        self.address = address
        self._store = store
        self._advertise = advertise_address
        self._on_order, self._on_epoch = on_order, on_epoch
        self._stop = threading.Event()  # this link's own: one link may close while the others run on
        self._interval_s, self._timeout_s = heartbeat_interval_s, timeout_s
        self._channel = open_channel(address, telemetry, tls=tls, peer_role="scheduler")
        self.stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._lock = threading.Lock()
        self._watch_call: grpc.Future | None = None
        node = store.node_id
        self._threads = [threading.Thread(target=self._heartbeat_loop, name=f"{node}-heartbeat", daemon=True),
                         threading.Thread(target=self._watch_loop, name=f"{node}-orders", daemon=True)]
        self.registrations = 0  # successful RegisterNode calls (for tests and logs)
        self.is_leader = False  # as this replica last said (answering_is_leader)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        """Ends both loops, the stream and the channel."""
        self._stop.set()
        with self._lock:
            cancel = getattr(self._watch_call, "cancel", None)  # instrumented streams may lack it
        if cancel is not None:
            cancel()
        self._channel.close()  # ends every call still open on it, the order stream included

    def join(self) -> None:
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
                reply = self.stub.Heartbeat(self._heartbeat_request(), timeout=self._timeout_s)
                self._heard(reply.leadership)
                registered = reply.known
                delay = interval if registered else 0.0
                backoff.reset()
            except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed by close()
                if self._stop.is_set():
                    return
                log.warning("scheduler %s: heartbeat failed: %s", self.address, describe(exc))
                delay = backoff.next()
            self._stop.wait(delay)

    def _register(self) -> float:
        stats = self._store.stats()
        reply = self.stub.RegisterNode(scheduler_pb2.RegisterNodeRequest(
            node_id=self._store.node_id, address=self._advertise, capacity_pages=stats.num_pages,
            geometry=geometry_to_proto(stats.geometry), host_pages=stats.host_pages,
            retain_max_blocks=stats.retain_max_blocks), timeout=self._timeout_s)
        self._heard(reply.leadership)
        self.registrations += 1
        log.info("registered %s at %s with the scheduler at %s", self._store.node_id, self._advertise, self.address)
        return reply.heartbeat_interval_ms / 1000.0 if reply.heartbeat_interval_ms else self._interval_s

    def _heard(self, leadership: scheduler_pb2.Leadership) -> None:
        self.is_leader = leadership.answering_is_leader
        if leadership.epoch:
            self._on_epoch(leadership.epoch)

    def _heartbeat_request(self) -> scheduler_pb2.HeartbeatRequest:
        stats = self._store.stats()
        return scheduler_pb2.HeartbeatRequest(node_id=self._store.node_id, free_pages=stats.available_pages,
                                              retained_blocks=stats.retained_blocks)

    # ---- orders ----------------------------------------------------------
    def _watch_loop(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                call = self.stub.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id=self._store.node_id))
                with self._lock:
                    self._watch_call = call
                for order in call:
                    backoff.reset()
                    self._on_order(self, order)
            except (grpc.RpcError, ValueError, RuntimeError) as exc:  # RuntimeError: submit after stop()
                if self._stop.is_set():
                    return
                log.warning("order stream from the scheduler at %s broke: %s", self.address, describe(exc))
            self._stop.wait(backoff.next())


def describe(exc: Exception) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'error'}: {details}"
