"""Each replica's routed requests, shared with the other replicas (adapter).

Every scheduler replica answers Route for its share of the routers' calls;
the planner's inputs (family heat, reuse history, pending load, the replica
ledger's uses) must still see every request, whichever replica routed it,
or the leader would plan from 1/N of the demand. So each replica sends what
each Route applied to its core (a RouteObservation) to every peer, which
applies it to its own core without routing (SchedulerCore.observe_routes).

- Off the request path: Route only appends to a bounded queue; a sender
  thread per peer sends batches (up to `batch_max`, at least every
  `flush_s`) with ShareRoutes. A full queue or a failed send drops the batch
  and counts it: a replica's planner state is a forecast input, never worth
  slowing a Route, and a peer that was down learns again from new requests.
- Peers are --peers' addresses: static ones, and every address a
  `dns:NAME:PORT` entry resolves to (common/discovery.py), re-resolved every
  few seconds, minus this replica's own addresses (a headless Service names
  it too): a sender is added for a peer that appears and stopped once its
  address has been gone for the grace period. The senders are a tuple
  replaced whole under a lock, so share() reads it without locking.
- Peers' states converge within flush_s plus one call; they are not a
  consensus: two replicas may route the same moment from slightly different
  load boards, as two routers of the field do (llm-d, Dynamo).
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Iterable, Sequence

import grpc

from speckv.services.common.discovery import Changes, Targets, parse_targets
from speckv.services.common.discovery_watch import GRACE_S, INTERVAL_S, Resolve, TargetWatcher, resolve_dns
from speckv.services.common.rpc.server import open_channel
from speckv.services.common.rpc.telemetry import Telemetry
from speckv.services.common.rpc.tls import TlsMaterial
from speckv.services.scheduler.adapters.observation_proto import observation_to_proto
from speckv.services.scheduler.routing.observation import RouteObservation
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SharingStats:
    sent: int = 0  # observations a peer applied
    dropped_full: int = 0  # the queue was full (the peer is slower than the routes)
    dropped_send: int = 0  # the call failed (the peer is down or refused)


class _PeerSender:
    def __init__(self, replica_id: str, address: str, telemetry: Telemetry | None, tls: TlsMaterial | None,
                 capacity: int, batch_max: int, flush_s: float, timeout_s: float) -> None:
        self.address = address
        self._replica_id = replica_id
        self._queue: queue.Queue[RouteObservation | None] = queue.Queue(capacity)
        self._batch_max, self._flush_s, self._timeout_s = batch_max, flush_s, timeout_s
        self._channel = open_channel(address, telemetry, tls=tls, peer_role="scheduler")
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self.stats = SharingStats()
        self._thread = threading.Thread(target=self._run, name=f"share-routes-{address}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, observation: RouteObservation) -> None:
        try:
            self._queue.put_nowait(observation)
        except queue.Full:
            self.stats.dropped_full += 1

    def stop(self) -> None:
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass  # the thread is sending; it sees the closed channel
        self._thread.join(timeout=self._timeout_s + 1.0)
        self._channel.close()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stopping = False
            while len(batch) < self._batch_max:
                try:
                    item = self._queue.get(timeout=self._flush_s)
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            self._send(batch)
            if stopping:
                return

    def _send(self, batch: list[RouteObservation]) -> None:
        # Packed here, on the sender's thread: a Route only queues its record.
        routes = [observation_to_proto(o) for o in batch]
        try:
            self._stub.ShareRoutes(scheduler_pb2.RouteObservations(replica_id=self._replica_id, routes=routes),
                                   timeout=self._timeout_s)
            self.stats.sent += len(batch)
        except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed by stop()
            self.stats.dropped_send += len(batch)
            log.debug("sharing %d routes with %s failed: %s", len(batch), self.address, exc)


class RouteSharing:
    """The module docstring's sender: one _PeerSender per peer address."""

    def __init__(self, replica_id: str, peers: str | Sequence[str] | Targets, telemetry: Telemetry | None,
                 tls: TlsMaterial | None = None, *, exclude: Iterable[str] = (), capacity: int = 10_000,
                 batch_max: int = 256, flush_s: float = 0.05, timeout_s: float = 2.0,
                 discovery_interval_s: float = INTERVAL_S, discovery_grace_s: float = GRACE_S,
                 resolve: Resolve = resolve_dns) -> None:
        targets = peers if isinstance(peers, Targets) else parse_targets(peers, "peers")
        self._sender_args = (replica_id, telemetry, tls, capacity, batch_max, flush_s, timeout_s)
        self._lock = threading.Lock()  # held by writers only; share() takes self._senders as it is
        self._stopped = False
        self._watcher = TargetWatcher(targets, self._peers_changed, name=f"peers-{replica_id}",
                                      interval_s=discovery_interval_s, grace_s=discovery_grace_s,
                                      resolve=resolve, exclude=exclude)
        self._senders: tuple[_PeerSender, ...] = tuple(self._sender(a) for a in self._watcher.initial())

    def _sender(self, address: str) -> _PeerSender:
        replica_id, telemetry, tls, capacity, batch_max, flush_s, timeout_s = self._sender_args
        return _PeerSender(replica_id, address, telemetry, tls, capacity, batch_max, flush_s, timeout_s)

    def start(self) -> "RouteSharing":
        for sender in self._senders:
            sender.start()
        self._watcher.start()
        return self

    def peers(self) -> tuple[str, ...]:
        """The addresses shared with now."""
        return tuple(sender.address for sender in self._senders)

    def share(self, observations: Sequence[RouteObservation]) -> None:
        """Never blocks (module docstring)."""
        for sender in self._senders:
            for observation in observations:
                sender.offer(observation)

    def stats(self) -> dict[str, SharingStats]:
        return {sender.address: sender.stats for sender in self._senders}

    def stop(self) -> None:
        self._watcher.stop()  # no sender is added or stopped after this
        with self._lock:
            self._stopped = True
            senders = self._senders
        for sender in senders:
            sender.stop()

    def _peers_changed(self, changes: Changes) -> None:
        """On the discovery thread: senders for the peers that appeared, the gone ones' stopped."""
        with self._lock:
            if self._stopped:
                return
            gone = [sender for sender in self._senders if sender.address in changes.removed]
            new = [self._sender(address) for address in changes.added]
            self._senders = tuple(s for s in self._senders if s not in gone) + tuple(new)
            for sender in new:
                sender.start()
        for sender in gone:
            log.info("peer replica %s is gone from DNS: no longer sharing routes with it", sender.address)
            sender.stop()
