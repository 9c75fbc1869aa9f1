"""A kvstore's KV events published as a vLLM engine publishes its own (events
out; ZMQ adapter: the mapping, the encoding and the frames are vllm_encode.py).

With `--kv-events-publish` the kvstore binds a PUB socket (and with
`--kv-events-replay` a ROUTER replay socket) that speak vLLM's
ZmqEventPublisher protocol, so what subscribes to vLLM engines (the speckv
scheduler's `--kv-events`, llm-d's KV-cache indexer, Dynamo's router) can
index this node as one more engine.

Rules:
- One source of truth: the follower thread reads the store's event log as a
  SubscribeEvents reader does (KVStoreCore.subscribe from sequence 0) and
  keeps no state of its own beyond the replay buffer. Each log event becomes
  one EventBatch, numbered 0, 1, 2, ... in this process as vLLM numbers its
  batches (not by the log's sequences: a snapshot repeats or skips those,
  and a subscriber would take that for a gap). A batch enters the replay
  buffer before it is sent, so a subscriber that sees sequence N and asks at
  once for what it missed finds everything below N.
- The kvstore never waits for a subscriber: the follower holds neither the
  store's lock nor the log's while it encodes or sends (the log hands events
  out in batches, outside its lock); PUB drops a slow subscriber's batches
  past its high-water mark, and an absent one gets nothing; a follower that
  falls behind the log's retention gets a snapshot, published as
  AllBlocksCleared followed by the resident blocks, as any late reader does.
- Replay: the replay thread owns the ROUTER socket. A request (start
  sequence, 8 bytes big-endian) is answered with every buffered batch from
  start as (sequence, payload), then (-1, b""). The buffer keeps the last
  `replay_batches` batches: older ones are not replayed, and the subscriber
  resets, as it would against vLLM. A reply is sent with ROUTER_MANDATORY
  and a send timeout, so a client that stops reading loses its reply (no end
  marker: its own timeout ends its wait) instead of holding the thread; the
  live stream is another thread and socket and never waits on a replay.
- Sequences start again at 0 when the kvstore restarts, as vLLM's do;
  subscribers read a lower sequence as a restart.
- Both sockets bind (the kvstore is the stable end, as vLLM binds by
  default): tcp://HOST:PORT, tcp://*:PORT (every interface) or ipc://PATH.
"""
from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import zmq

from speckv.services.common.errors import InvalidArgument, Unavailable
from speckv.services.kvstore.events import EventType, KVEvent
from speckv.services.kvstore.vllm_encode import (
    Encoding,
    encode_event,
    parse_replay_request,
    publish_frames,
    replay_end_frames,
    replay_frames,
)

log = logging.getLogger(__name__)

DEFAULT_REPLAY_BATCHES = 10_000  # vLLM's buffer_steps
SEND_HWM = 100_000  # vLLM's PUB high-water mark: batches queued per subscriber before PUB drops
POLL_S = 0.1  # how often an idle thread looks for stop
REPLAY_SEND_TIMEOUT_MS = 2_000  # a replay client that reads nothing this long loses its reply


def check_endpoint(name: str, endpoint: str) -> None:
    """InvalidArgument naming the field unless endpoint is one a socket can
    bind: tcp://HOST:PORT, tcp://*:PORT or ipc://PATH."""
    scheme, sep, rest = endpoint.partition("://")
    host, colon, port = rest.rpartition(":")
    tcp_ok = scheme == "tcp" and colon and host and (port.isdigit() and 0 < int(port) < 65536)
    if not sep or not (tcp_ok or (scheme == "ipc" and rest)):
        raise InvalidArgument(f"{name}={endpoint!r}: expected tcp://HOST:PORT, tcp://*:PORT or ipc://PATH "
                              "(the kvstore binds it)")


@dataclass(frozen=True, slots=True)
class PublisherSettings:
    """What to publish where (KVStoreConfig's kv_events_* fields)."""

    endpoint: str  # the PUB socket
    replay_endpoint: str = ""  # the ROUTER replay socket; "" = none
    topic: str = ""  # the first frame of every batch (vLLM's default is "")
    encoding: Encoding = Encoding.TAGGED
    replay_batches: int = DEFAULT_REPLAY_BATCHES


class EventSource(Protocol):
    """What the publisher needs of the store (KVStoreCore has it)."""

    def subscribe(self, after_sequence: int, keep_going: Callable[[], bool] = ...,
                  poll_s: float = ...) -> Iterator[KVEvent]: ...


@dataclass(slots=True)
class ReplayBuffer:
    """The last `capacity` published batches as (sequence, payload), oldest
    first. Invariants: sequences are consecutive (each append is the one
    after the last); at most capacity are kept. Thread-safe: the follower
    appends while the replay thread reads."""

    capacity: int
    _batches: deque[tuple[int, bytes]] = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.capacity <= 0:
            raise ValueError(f"capacity={self.capacity}: must be > 0")
        self._batches = deque(maxlen=self.capacity)

    def append(self, sequence: int, payload: bytes) -> None:
        with self._lock:
            if self._batches and sequence != self._batches[-1][0] + 1:
                raise ValueError(f"sequence {sequence} does not follow {self._batches[-1][0]}")
            self._batches.append((sequence, payload))

    def since(self, start: int) -> list[tuple[int, bytes]]:
        """The kept batches with sequence >= start, in order (a copy)."""
        with self._lock:
            if not self._batches:
                return []
            skip = max(0, start - self._batches[0][0])  # consecutive: the position follows from the sequence
            return list(itertools.islice(self._batches, skip, None))

    def __len__(self) -> int:
        with self._lock:
            return len(self._batches)


@dataclass(slots=True)
class PublisherStats:
    """Counts of one publisher (cumulative)."""

    published: int = 0  # batches sent on the PUB socket (the next sequence)
    snapshots: int = 0  # resets published (AllBlocksCleared and the resident blocks)
    replays: int = 0  # replay requests answered to their end marker
    replay_failures: int = 0  # malformed requests, and replies given up (client gone or not reading)


class VllmEventPublisher:
    """The PUB and ROUTER sockets of one kvstore and their two threads. Each
    socket is bound here and then used by its own thread only (zmq sockets
    are not thread-safe; starting the thread hands it over)."""

    def __init__(self, source: EventSource, settings: PublisherSettings, node_id: str = "") -> None:
        self._source, self.settings, self._node_id = source, settings, node_id
        self._topic = settings.topic.encode()
        self._buffer = ReplayBuffer(settings.replay_batches)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stats = PublisherStats()
        self._context = zmq.Context()
        self._pub: zmq.Socket | None = None
        self._router: zmq.Socket | None = None
        try:
            self._pub = self._bind(zmq.PUB, settings.endpoint, "kv_events_publish", {zmq.SNDHWM: SEND_HWM})
            if settings.replay_endpoint:
                self._router = self._bind(zmq.ROUTER, settings.replay_endpoint, "kv_events_replay",
                                          {zmq.ROUTER_MANDATORY: 1, zmq.SNDTIMEO: REPLAY_SEND_TIMEOUT_MS})
        except Unavailable:
            self._close_sockets()
            self._context.term()
            raise
        # Read once, here: after start() each socket belongs to its thread.
        self.endpoints = (_bound(self._pub), _bound(self._router))  # ports resolved; "" = no replay socket
        self._threads = [threading.Thread(target=self._follow, name=f"{node_id}-vllm-events-pub", daemon=True)]
        if self._router is not None:
            self._threads.append(threading.Thread(target=self._serve_replay, name=f"{node_id}-vllm-events-replay",
                                                  daemon=True))
        self._started = False

    def _bind(self, kind: int, endpoint: str, name: str, options: dict[int, int]) -> zmq.Socket:
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        if endpoint.startswith("tcp://["):
            socket.setsockopt(zmq.IPV6, 1)  # zmq binds an IPv6 address only when asked to
        for option, value in options.items():
            socket.setsockopt(option, value)
        try:
            socket.bind(endpoint)
        except zmq.ZMQError as exc:
            socket.close(linger=0)
            raise Unavailable(f"{name}={endpoint!r}: cannot bind ({exc})") from None
        return socket

    def start(self) -> "VllmEventPublisher":
        pub, replay = self.endpoints
        log.info("node %s publishes its KV events in vLLM's format (%s) on %s%s", self._node_id,
                 self.settings.encoding.value, pub, f", replay on {replay}" if replay else "")
        self._started = True
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if not self._started:
            self._close_sockets()
        elif not all([self._join(t, timeout_s) for t in self._threads]):
            # a thread still holds its socket: terminating the context would block on it
            log.warning("node %s: a vLLM KV event thread did not end within %.1f s; its zmq context is left open",
                        self._node_id, timeout_s)
            return
        self._context.term()

    @staticmethod
    def _join(thread: threading.Thread, timeout_s: float) -> bool:
        thread.join(timeout_s)
        return not thread.is_alive()

    def stats(self) -> PublisherStats:
        with self._lock:
            s = self._stats
            return PublisherStats(s.published, s.snapshots, s.replays, s.replay_failures)

    def _close_sockets(self) -> None:
        for socket in (self._pub, self._router):
            if socket is not None:
                socket.close(linger=0)

    # --- the follower: log -> PUB --------------------------------------------
    def _follow(self) -> None:
        pub = self._pub
        assert pub is not None
        sequence = 0
        try:
            for event in self._source.subscribe(0, lambda: not self._stop.is_set(), POLL_S):
                payload = encode_event(event, self.settings.encoding)
                self._buffer.append(sequence, payload)
                pub.send_multipart(publish_frames(self._topic, sequence, payload))  # PUB drops, never blocks
                sequence += 1
                with self._lock:
                    self._stats.published = sequence
                    if event.type is EventType.SNAPSHOT:
                        self._stats.snapshots += 1
                if event.type is EventType.SNAPSHOT:
                    log.warning("node %s: the vLLM KV event publisher started after blocks were stored, or fell "
                                "behind the event log's retention: it published a reset and the %d resident blocks",
                                self._node_id, len(event.block_hashes) + len(event.host_block_hashes) + len(event.disk_block_hashes))
        except Exception:  # a bug must not take the kvstore down: publishing ends, loudly
            log.exception("node %s: the vLLM KV event publisher ended by an unexpected error", self._node_id)
        finally:
            pub.close(linger=0)

    # --- the replay socket ---------------------------------------------------
    def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        try:
            while not self._stop.is_set():
                if not router.poll(int(POLL_S * 1000)):
                    continue
                frames = router.recv_multipart()
                request = parse_replay_request(frames)
                if request is None:
                    self._replay_failed(f"a malformed replay request of {len(frames)} frames")
                    continue
                self._answer(router, *request)
        except Exception:
            log.exception("node %s: the vLLM KV event replay socket ended by an unexpected error", self._node_id)
        finally:
            router.close(linger=0)

    def _answer(self, router: zmq.Socket, client: bytes, start: int) -> None:
        try:
            for sequence, payload in self._buffer.since(start):
                if self._stop.is_set():
                    return
                router.send_multipart(replay_frames(client, sequence, payload))
            router.send_multipart(replay_end_frames(client))
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the client left; EAGAIN: it read nothing for the send timeout
            self._replay_failed(f"a replay from {start} given up ({exc})")
            return
        with self._lock:
            self._stats.replays += 1

    def _replay_failed(self, what: str) -> None:
        with self._lock:
            self._stats.replay_failures += 1
        log.warning("node %s: vLLM KV event replay: %s", self._node_id, what)


def _bound(socket: zmq.Socket | None) -> str:
    return socket.getsockopt_string(zmq.LAST_ENDPOINT) if socket is not None else ""
