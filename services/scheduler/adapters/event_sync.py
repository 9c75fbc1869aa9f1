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
  generation moved on): the thread ends.
- Loss (issue 27): when a stream that had connected (its channel was READY)
  ends or breaks, the thread reconnects at once, without the backoff, and
  watches that new connection for up to `probe_s`. Refused or unreachable
  (the channel reports TRANSIENT_FAILURE) means the kvstore process is gone:
  `lost(node, generation, reason)` is called once and the thread ends. Two
  signals, never one: a stream broken by a transient error whose reconnect
  succeeds is followed on as before, and a reconnect that neither connects
  nor fails within probe_s (a host that drops packets) decides nothing, so
  the heartbeat timeout rules there. A stream that never connected (a node
  restored from saved state whose kvstore is not up yet) is no loss either.
  `suspect()` runs the same reconnect check when someone else saw the node
  fail (an agent's data-plane write to it: server.py).
- `follow()` of a node replaces its thread; `stop_all()` ends every thread
  (server stop). Stopping closes the stream's channel, which cancels the RPC,
  so no thread stays blocked in a read (an instrumented stream may be a
  plain generator without cancel()).

Limit: sequences carry no incarnation, so a kvstore that restarts at the same
address *without* re-registering and has already logged past our last
sequence cannot be told apart from the one we followed. The kvstore agent
re-registers on start, which restarts the stream from 0; an epoch field in
KVEvent would close the gap. With loss detection on, such a restart is
usually seen as a loss (the stream closed, the immediate reconnect refused
while the new process starts) and the node must register again anyway.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import grpc

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import NodeId
from speckv.services.common.rpc.server import open_channel
from speckv.services.common.rpc.telemetry import Telemetry
from speckv.services.common.tiers import Tier
from speckv.services.common.rpc.tls import TlsMaterial
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc

log = logging.getLogger(__name__)

ApplyFn = Callable[[NodeId, int, IndexEvent], bool]
ResetFn = Callable[[NodeId, int], bool]
LostFn = Callable[[NodeId, int, str], None]  # (node, generation, reason): its kvstore process is gone
PROBE_S = 1.0  # how long the reconnect after a closed stream may take to connect or be refused

KIND_OF_EVENT = {
    kvstore_pb2.KV_EVENT_TYPE_STORED: HolderEventKind.STORED,
    kvstore_pb2.KV_EVENT_TYPE_REMOVED: HolderEventKind.REMOVED,
    kvstore_pb2.KV_EVENT_TYPE_COMMITTED: HolderEventKind.COMMITTED,
    kvstore_pb2.KV_EVENT_TYPE_SNAPSHOT: HolderEventKind.SNAPSHOT,
}

# The media kvstores send, spelled as they send them: one lookup, no parse (Tier.parse takes the rest).
TIER_OF_MEDIUM = {tier.medium: tier for tier in Tier} | {"": Tier.DEVICE}


def to_index_event(event: kvstore_pb2.KVEvent) -> IndexEvent | None:
    kind = KIND_OF_EVENT.get(event.type)
    if kind is None:
        return None
    medium = event.medium
    tier = TIER_OF_MEDIUM.get(medium)
    if tier is None:
        try:
            tier = Tier.parse(medium)
        except InvalidArgument:
            log.warning("kv event %d from %s names an unknown medium %r; skipped", event.sequence, event.node_id,
                        medium)
            return None
    if kind is not HolderEventKind.SNAPSHOT:  # only a snapshot lists the lower tiers apart
        return IndexEvent(kind, list(event.block_hashes), event.has_parent, event.family, event.sequence, tier)
    return IndexEvent(kind, list(event.block_hashes), event.has_parent, event.family, event.sequence, tier,
                      list(event.host_block_hashes) or None, list(event.disk_block_hashes) or None)


class _Connectivity:
    """What a channel's connectivity has been: READY once (connected), and
    TRANSIENT_FAILURE once (a connect refused or failed). Thread-safe: gRPC
    calls watch() on its own threads."""

    def __init__(self, channel: grpc.Channel, try_to_connect: bool) -> None:
        self.ready, self.failed = threading.Event(), threading.Event()
        self._changed = threading.Event()
        self._channel = channel
        channel.subscribe(self._watch, try_to_connect=try_to_connect)

    def _watch(self, state: grpc.ChannelConnectivity) -> None:
        if state is grpc.ChannelConnectivity.READY:
            self.ready.set()
        elif state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            self.failed.set()
        self._changed.set()

    def wait_verdict(self, timeout_s: float, stop: threading.Event) -> bool | None:
        """True once connected, False once refused, None when neither came
        within timeout_s (or stop was set)."""
        deadline = time.monotonic() + timeout_s
        while not stop.is_set():
            if self.ready.is_set():
                return True
            if self.failed.is_set():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._changed.wait(min(left, 0.05))
            self._changed.clear()
        return None

    def close(self) -> None:
        self._channel.unsubscribe(self._watch)


class NodeEventStream:
    """The subscription thread of one node registration."""

    def __init__(self, node_id: NodeId, address: str, generation: int, apply: ApplyFn,
                 reset: ResetFn, telemetry: Telemetry | None,
                 backoff_s: float = 0.05, backoff_max_s: float = 2.0, tls: TlsMaterial | None = None,
                 lost: LostFn | None = None, probe_s: float = PROBE_S) -> None:
        self.node_id, self.address, self.generation = node_id, address, generation
        self._apply, self._reset, self._telemetry, self._tls = apply, reset, telemetry, tls
        self._backoff_s, self._backoff_max_s = backoff_s, backoff_max_s
        self._lost, self._probe_s = lost, probe_s
        self._suspecting = False  # a suspect() check is running
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
            watch = _Connectivity(channel, try_to_connect=False) if self._lost is not None else None
            ended = "stream ended"
            try:
                backoff = self._follow(kvstore_pb2_grpc.KVStoreStub(channel), backoff)
            except grpc.RpcError as exc:
                ended = f"stream broke ({_code(exc)})"
                if not self._stop.is_set():
                    log.debug("kv events from %s (%s) broke: %s", self.node_id, self.address, exc)
            except ValueError:
                pass  # the channel was closed under the call by stop()
            finally:
                if watch is not None:
                    watch.close()
                self._close(channel)
            if watch is not None and watch.ready.is_set() and not self._stop.is_set() and self._gone(ended):
                return
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self._backoff_max_s)

    def _gone(self, ended: str) -> bool:
        """After a connected stream closed: reconnects at once and, when that
        is refused, reports the node lost (once) and stops; True then."""
        return self._probe(f"its kvstore's event stream closed ({ended})")

    def suspect(self, why: str) -> None:
        """Someone else saw this node fail (an agent's write to it): checks on
        a thread of its own, with the same reconnect as after a closed
        stream, and reports the node lost only when the scheduler's own
        connect is refused. At most one such check at a time."""
        with self._channel_lock:
            if self._stop.is_set() or self._lost is None or self._suspecting:
                return
            self._suspecting = True

        def check() -> None:
            try:
                self._probe(why)
            finally:
                with self._channel_lock:
                    self._suspecting = False

        threading.Thread(target=check, name=f"kv-suspect-{self.node_id}", daemon=True).start()

    def _probe(self, why: str) -> bool:
        channel = self._probe_channel()
        if channel is None:
            return False
        watch = _Connectivity(channel, try_to_connect=True)
        try:
            verdict = watch.wait_verdict(self._probe_s, self._stop)
        finally:
            watch.close()
            channel.close()
        with self._channel_lock:
            if verdict is not False or self._stop.is_set():
                return False
            self._stop.set()  # one report: the stream thread and a suspicion check may both get here
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
        assert self._lost is not None  # only probed with a lost callback
        self._lost(self.node_id, self.generation, f"{why}; the reconnect to {self.address} was refused")
        return True

    def _probe_channel(self) -> grpc.Channel | None:
        # Its own subchannel: a shared one may still carry the old connection's state.
        options = [("grpc.use_local_subchannel_pool", 1)]
        with self._channel_lock:
            if self._stop.is_set():
                return None
            return (self._tls.secure_channel(self.address, options, "kvstore") if self._tls is not None
                    else grpc.insecure_channel(self.address, options=options))

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


def _code(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    return code.name if code is not None else "?"


class EventSync:
    """Owns one NodeEventStream per node. Thread-safe. lost: told when a
    node's kvstore is seen gone (NodeEventStream's loss rule); None: no
    loss detection, the heartbeat timeout alone declares nodes down."""

    def __init__(self, apply: ApplyFn, reset: ResetFn, telemetry: Telemetry | None,
                 backoff_s: float = 0.05, backoff_max_s: float = 2.0, tls: TlsMaterial | None = None,
                 lost: LostFn | None = None, probe_s: float = PROBE_S) -> None:
        self._apply, self._reset, self._telemetry, self._tls = apply, reset, telemetry, tls
        self._backoff = (backoff_s, backoff_max_s)
        self._lost, self._probe_s = lost, probe_s
        self._streams: dict[NodeId, NodeEventStream] = {}
        self._lock = threading.Lock()
        self._closed = False

    def follow(self, node_id: NodeId, address: str, generation: int) -> None:
        """(Re)starts the subscription of node_id at address."""
        stream = NodeEventStream(node_id, address, generation, self._apply, self._reset,
                                 self._telemetry, *self._backoff, tls=self._tls, lost=self._lost,
                                 probe_s=self._probe_s)
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

    def suspect(self, node_id: NodeId, why: str) -> None:
        """Checks node_id's kvstore now (NodeEventStream.suspect); nothing
        when it has no stream (unknown, a vLLM-fed node)."""
        with self._lock:
            stream = self._streams.get(node_id)
        if stream is not None:
            stream.suspect(why)

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
