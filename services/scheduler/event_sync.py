"""Keeps the block index in step with each node's kvstore (gRPC adapter).

One background thread per registered node subscribes to that kvstore's
SubscribeEvents from the last sequence it applied and hands each event to
`apply(node, generation, event)`. Rules:
- The first subscription of a registration starts at sequence 0 on an empty
  inventory; a SNAPSHOT event replaces the node's inventory.
- A gap in sequence numbers (events lost) resets the node's inventory and
  resubscribes from 0, so the kvstore replays or snapshots.
- A broken stream is reopened after a backoff doubling from 50 ms to 2 s
  (reset by every event received).
- `apply` returning False means the node was re-registered or removed (its
  generation moved on): the thread ends. `follow()` of a node replaces its
  thread; `stop_all()` ends every thread (server stop). Stopping closes the
  stream's channel, which cancels the RPC, so no thread stays blocked in a
  read (an instrumented stream may be a plain generator without cancel()).

Limit: sequences carry no incarnation, so a kvstore that restarts at the same
address *without* re-registering and has already logged past our last
sequence cannot be told apart from the one we followed. The kvstore agent
re-registers on start, which restarts the stream from 0; an epoch field in
KVEvent would close the gap.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import grpc

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import NodeId
from speckv.services.common.server import open_channel
from speckv.services.common.telemetry import Telemetry
from speckv.services.common.tiers import Tier
from speckv.services.common.tls import TlsMaterial
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc

log = logging.getLogger(__name__)

ApplyFn = Callable[[NodeId, int, IndexEvent], bool]
ResetFn = Callable[[NodeId, int], bool]

KIND_OF_EVENT = {
    kvstore_pb2.KV_EVENT_TYPE_STORED: HolderEventKind.STORED,
    kvstore_pb2.KV_EVENT_TYPE_REMOVED: HolderEventKind.REMOVED,
    kvstore_pb2.KV_EVENT_TYPE_COMMITTED: HolderEventKind.COMMITTED,
    kvstore_pb2.KV_EVENT_TYPE_SNAPSHOT: HolderEventKind.SNAPSHOT,
}


def to_index_event(event: kvstore_pb2.KVEvent) -> IndexEvent | None:
    kind = KIND_OF_EVENT.get(event.type)
    if kind is None:
        return None
    try:
        tier = Tier.parse(event.medium)
    except InvalidArgument:
        log.warning("kv event %d from %s names an unknown medium %r; skipped", event.sequence, event.node_id,
                    event.medium)
        return None
    return IndexEvent(kind, list(event.block_hashes), event.has_parent, event.family, event.sequence, tier,
                      list(event.host_block_hashes) or None)


class NodeEventStream:
    """The subscription thread of one node registration."""

    def __init__(self, node_id: NodeId, address: str, generation: int, apply: ApplyFn,
                 reset: ResetFn, telemetry: Telemetry | None,
                 backoff_s: float = 0.05, backoff_max_s: float = 2.0, tls: TlsMaterial | None = None) -> None:
        self.node_id, self.address, self.generation = node_id, address, generation
        self._apply, self._reset, self._telemetry, self._tls = apply, reset, telemetry, tls
        self._backoff_s, self._backoff_max_s = backoff_s, backoff_max_s
        self._stop = threading.Event()
        self._channel_lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self.last_sequence = 0
        self.events_applied = 0
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{node_id}", daemon=True)

    def start(self) -> "NodeEventStream":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._channel_lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()  # cancels the blocked read

    def join(self, timeout_s: float) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        backoff = self._backoff_s
        while not self._stop.is_set():
            channel = self._open()
            if channel is None:
                return
            try:
                backoff = self._follow(kvstore_pb2_grpc.KVStoreStub(channel), backoff)
            except grpc.RpcError as exc:
                if not self._stop.is_set():
                    log.debug("kv events from %s (%s) broke: %s", self.node_id, self.address, exc)
            except ValueError:
                pass  # the channel was closed under the call by stop()
            finally:
                self._close(channel)
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self._backoff_max_s)

    def _open(self) -> grpc.Channel | None:
        with self._channel_lock:
            if self._stop.is_set():
                return None
            self._channel = open_channel(self.address, self._telemetry, tls=self._tls, peer_role="kvstore")
            return self._channel

    def _close(self, channel: grpc.Channel) -> None:
        with self._channel_lock:
            if self._channel is channel:
                self._channel = None
        channel.close()

    def _follow(self, stub: kvstore_pb2_grpc.KVStoreStub, backoff: float) -> float:
        """Reads one stream until it ends; returns the backoff to use next.
        Leaving the loop early is enough: the caller closes the channel."""
        request = kvstore_pb2.SubscribeEventsRequest(after_sequence=self.last_sequence)
        for message in stub.SubscribeEvents(request):
            backoff = self._backoff_s
            if not self._take(message):
                break
        return backoff

    def _take(self, message: kvstore_pb2.KVEvent) -> bool:
        """Applies one event; False ends this stream (stop, stale, or a gap)."""
        event = to_index_event(message)
        if event is None:  # a kind or medium this index does not know: skipped, not a gap
            if self.last_sequence and message.sequence == self.last_sequence + 1:
                self.last_sequence = message.sequence
            return True
        if event.kind is not HolderEventKind.SNAPSHOT and self.last_sequence:
            if event.sequence <= self.last_sequence:
                return True  # a replay of what we already applied
            if event.sequence != self.last_sequence + 1:
                log.warning("kv events from %s: gap after %d (got %d); resyncing",
                            self.node_id, self.last_sequence, event.sequence)
                self.last_sequence = 0
                if not self._reset(self.node_id, self.generation):
                    self._stop.set()
                return False
        if not self._apply(self.node_id, self.generation, event):
            self._stop.set()  # the node was re-registered or removed
            return False
        self.last_sequence = event.sequence
        self.events_applied += 1
        return not self._stop.is_set()


class EventSync:
    """Owns one NodeEventStream per node. Thread-safe."""

    def __init__(self, apply: ApplyFn, reset: ResetFn, telemetry: Telemetry | None,
                 backoff_s: float = 0.05, backoff_max_s: float = 2.0, tls: TlsMaterial | None = None) -> None:
        self._apply, self._reset, self._telemetry, self._tls = apply, reset, telemetry, tls
        self._backoff = (backoff_s, backoff_max_s)
        self._streams: dict[NodeId, NodeEventStream] = {}
        self._lock = threading.Lock()
        self._closed = False

    def follow(self, node_id: NodeId, address: str, generation: int) -> None:
        """(Re)starts the subscription of node_id at address."""
        stream = NodeEventStream(node_id, address, generation, self._apply, self._reset,
                                 self._telemetry, *self._backoff, tls=self._tls)
        with self._lock:
            old = self._streams.get(node_id)
            if self._closed or (old is not None and old.generation > generation):
                return  # closed, or a newer registration already streams
            self._streams[node_id] = stream
            stream.start()
        if old is not None:
            old.stop()

    def forget(self, node_id: NodeId) -> None:
        with self._lock:
            stream = self._streams.pop(node_id, None)
        if stream is not None:
            stream.stop()

    def stream(self, node_id: NodeId) -> NodeEventStream | None:
        with self._lock:
            return self._streams.get(node_id)

    def stop_all(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._closed = True
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.stop()
        for stream in streams:
            stream.join(timeout_s)
