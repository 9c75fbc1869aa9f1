"""Nodes fed by vLLM's KV event streams (ZMQ adapter; the wire format and the
sequence rules live in vllm_decode.py).

`--kv-events` names vLLM engines. For each one a thread subscribes (SUB) to
the engine's ZMQ PUB endpoint. An engine with no speckv kvstore beside it: the
thread registers the node with the scheduler core when the connection first
comes up, and feeds every batch through the same apply/reset path the
kvstores' event streams use (event_sync.py), so the node is indexed and
routed like any other. An engine whose connector saves into a kvstore
registered under the same node id (`kvstore=1`): the thread registers
nothing and sends no heartbeats (the kvstore does both); its events join the
kvstore's as a second source of the node's inventory (source_merge.py).

Rules:
- Liveness: the thread heartbeats the node (an empty load report: no queue
  figures, like a kvstore's) every heartbeat interval while its connection to
  the PUB socket is up, so an engine that goes away stops getting routes after
  node_timeout_s. Anyone may still report the node's queue via Heartbeat.
  vLLM's publisher sends no heartbeat of its own, so with `health=URL` a
  prober (vllm_health.py, rules in engine_liveness.py) also GETs the engine's
  /health: when it declares the engine dead the thread drops the engine's
  blocks (`node_lost`: an engine-only node goes down at once, as a kvstore's
  lost stream takes its node down; beside a kvstore only the engine's source
  is reset, the kvstore's blocks stay), stops heartbeating and registering,
  and skips the batches that still arrive (Skip.ENGINE_DEAD). When the probe
  answers again the engine is taken to be back empty: an engine-only node
  registers again at once (a new incarnation), and the next batch starts
  over as a fresh subscription (reset, replay from 0), so its events
  repopulate it.
- Sequences (SequenceTracker): a gap is caught up from the engine's replay
  (ROUTER) socket; with no replay endpoint, or a replay that fails or no
  longer holds every missed batch, the node's inventory is reset and the feed
  carries on (what the replay did return is applied on top when it ends just
  before the live batch). A fresh connection (start-up, or any reconnection:
  the engine may have restarted) resets and replays from sequence 0.
- Bad input is counted per reason (`stats()`) and logged at each power of ten,
  never raised; a stale generation (the node id was re-registered by someone
  else) ends the thread.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from speckv.services.common.errors import SpeckvError
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.adapters.vllm_decode import (
    BadInput,
    SequenceTracker,
    Skip,
    VllmBatchDecoder,
    contiguous_run,
    replay_request,
    split_frames,
    split_replay_frames,
)
from speckv.services.scheduler.adapters.vllm_health import HealthProber, http_probe
from speckv.services.scheduler.adapters.vllm_spec import DEFAULT_PAGES, VllmNodeSpec, parse_kv_events
from speckv.services.scheduler.cluster import LoadReport
from speckv.services.scheduler.engine_liveness import LivenessRule, Outcome, Transition
from speckv.services.scheduler.holder_index import IndexEvent

__all__ = ["DEFAULT_PAGES", "FeedStats", "NodeSink", "VllmEventFeeds", "VllmNodeFeed", "VllmNodeSpec",
           "parse_kv_events"]  # the spec's names, re-exported for this module's callers

log = logging.getLogger(__name__)

POLL_MS = 100  # how often an idle thread checks for stop and heartbeats
RECEIVE_HWM = 100_000  # as vLLM's PUB: live batches queue here while a replay runs
MAX_REPLAY_BATCHES = 1_000_000  # bounds a runaway replay (vLLM buffers 10,000 by default)


# --- the scheduler side ------------------------------------------------------

class NodeSink(Protocol):
    """What a feed needs of the scheduler core (SchedulerCore has it)."""

    def register_node(self, node_id: str, address: str, sizes: NodeSizes,
                      geometry: KVGeometry | None) -> tuple[bool, int]: ...

    def generation(self, node_id: str) -> int: ...

    def heartbeat(self, node_id: str, load: LoadReport) -> bool: ...

    def apply_kv_events(self, node_id: NodeId, generation: int, events: Sequence[IndexEvent]) -> bool: ...

    def reset_inventory(self, node_id: NodeId, generation: int) -> bool: ...

    def node_lost(self, node_id: str, reason: str, generation: int | None = None) -> bool: ...


@dataclass(slots=True)
class FeedStats:
    """Counts of one node's feed (cumulative)."""

    batches: int = 0  # batches applied, replayed ones included
    events: int = 0  # index events applied
    replays: int = 0  # catch-ups that recovered every missed batch
    resets: int = 0  # inventory resets (gaps not recovered, restarts, reconnections)
    deaths: int = 0  # times the health probe declared the engine dead (its blocks dropped)
    revivals: int = 0  # times it answered again after that
    skipped: dict[str, int] = field(default_factory=dict)  # Skip reason -> count (events, or batches for
    # bad_frames / garbage)


ANSWER_PROBE_S = 0.25  # a dead engine's batches probe its server at most this often (the feed thread's own GET)


class _Stop(Exception):
    """The node's generation moved on, or stop() was called: end the thread."""


class VllmNodeFeed:
    """The subscription thread of one vLLM engine. Its sockets live and die in
    its own thread (zmq sockets are not thread-safe)."""

    def __init__(self, spec: VllmNodeSpec, sink: NodeSink, context: zmq.Context, block_size: int,
                 heartbeat_interval_s: float, replay_timeout_s: float = 2.0,
                 health_rule: LivenessRule | None = None) -> None:
        self.spec, self.node_id = spec, NodeId(spec.node_id)
        rule = health_rule or LivenessRule()
        self._probe = http_probe(spec.health, rule.timeout_s) if spec.health else None
        self._prober = HealthProber(spec.node_id, self._probe, rule) if self._probe is not None else None
        self._engine_dead = False  # as the prober last said (only this feed's thread reads or writes it)
        self._probed_at = -math.inf  # time.monotonic() of this thread's last own probe of a dead engine
        self._sink, self._context = sink, context
        self._decoder = VllmBatchDecoder(block_size, spec.digest)
        self._tracker = SequenceTracker()
        self._heartbeat_s, self._replay_timeout_s = heartbeat_interval_s, replay_timeout_s
        self._generation: int | None = None
        self._connected = False
        self._replay: zmq.Socket | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stats = FeedStats()
        self._thread = threading.Thread(target=self._run, name=f"vllm-events-{spec.node_id}", daemon=True)

    def start(self) -> "VllmNodeFeed":
        self._thread.start()
        if self._prober is not None:
            self._prober.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._prober is not None:
            self._prober.stop()

    def join(self, timeout_s: float) -> bool:
        """True when the thread has ended (the prober's may end later: it holds no socket)."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._prober is not None:
            self._prober.join(timeout_s)
        return not self._thread.is_alive()

    def stats(self) -> FeedStats:
        with self._lock:
            s = self._stats
            return FeedStats(s.batches, s.events, s.replays, s.resets, s.deaths, s.revivals, dict(s.skipped))

    # --- the thread -------------------------------------------------------
    def _run(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sub.setsockopt(zmq.SUBSCRIBE, self.spec.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(self.spec.endpoint)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        next_beat = 0.0
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(POLL_MS))
                if monitor in ready:
                    self._on_monitor(recv_monitor_message(monitor))
                self._check_health()
                if sub in ready:
                    self._drain(sub)
                now = time.monotonic()
                if self._connected and self._generation is not None and not self._engine_dead and now >= next_beat:
                    if self._sink.generation(self.spec.node_id) != self._generation:
                        self._stale()  # never keep alive a registration that is not ours
                    if not self._sink.heartbeat(self.node_id, LoadReport()):
                        self._register_again()
                    next_beat = now + self._heartbeat_s
        except _Stop:
            pass
        except Exception:  # a bug must not take the scheduler down: this node's feed ends, loudly
            log.exception("vLLM KV events of %s: feed ended by an unexpected error", self.node_id)
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            self._close_replay()

    def _on_monitor(self, message: dict) -> None:
        if message["event"] == zmq.EVENT_CONNECTED:
            self._connected = True
            log.info("vLLM KV events of %s: connected to %s", self.node_id, self.spec.endpoint)
            if self._generation is None and not self._engine_dead:
                self._register()
        elif message["event"] == zmq.EVENT_DISCONNECTED:
            self._connected = False
            self._tracker.lost_connection()
            log.warning("vLLM KV events of %s: lost %s; the node goes down unless it comes back",
                        self.node_id, self.spec.endpoint)

    def _register_again(self) -> None:
        """The scheduler declared the node down (its heartbeat was refused): it
        comes back as a new incarnation, its inventory rebuilt from what the
        engine publishes from now on (vLLM keeps no event log to replay from 0)."""
        log.warning("vLLM KV events of %s: the scheduler had declared the node down; registering again",
                    self.node_id)
        self._register()

    def _register(self) -> None:
        try:
            self._sink.register_node(self.spec.node_id, self.spec.route_address, NodeSizes(self.spec.pages), None)
            self._generation = self._sink.generation(self.spec.node_id)
        except SpeckvError as exc:
            log.error("vLLM KV events of %s: cannot register the node (%s); its feed ends", self.node_id, exc)
            raise _Stop from None
        if self.spec.kvstore:
            log.info("vLLM KV events of %s: the engine's blocks join its kvstore's (a second source)", self.node_id)
        else:
            log.info("node %s registered from vLLM KV events (Route answers %s; no kvstore confirms its prefixes)",
                     self.node_id, self.spec.route_address)

    def _drain(self, sub: zmq.Socket) -> None:
        """Handles what has arrived, a bounded number at a time so stop and
        heartbeats are never starved."""
        for _ in range(1000):
            try:
                frames = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if self._engine_dead and not self._answers_now():
                # Its blocks left the index and its server does not answer: what a dying engine still says.
                self._count(Skip.ENGINE_DEAD, 1, "a batch arrived while the health probe says the engine is dead")
                continue
            if self._generation is None:
                self._register()  # a batch raced the monitor's connected event
            self._on_message(frames)

    def _check_health(self) -> None:
        """Acts on what the prober concluded since the last look."""
        for outcome, detail in self._prober.take() if self._prober is not None else ():
            if outcome.transition is Transition.DIED:
                self._engine_died(outcome, detail)
            elif outcome.transition is Transition.REVIVED and self._engine_dead:
                self._revive()

    def _answers_now(self) -> bool:
        """A batch arrived from an engine taken for dead: probe its server at
        once (at most every ANSWER_PROBE_S) rather than drop the batch until
        the prober's next round. An engine starting up is declared dead before
        its server first answers, and the first batches it publishes once it
        does would otherwise be lost (no replay brings them back)."""
        now = time.monotonic()
        if self._probe is None or now - self._probed_at < ANSWER_PROBE_S:
            return False
        self._probed_at = now
        healthy, _detail = self._probe()
        if healthy:
            self._revive()
        return healthy

    def _revive(self) -> None:
        self._engine_dead = False
        with self._lock:
            self._stats.revivals += 1
        log.info("vLLM engine of %s answers %s again: taken to be back empty; its events repopulate it",
                 self.node_id, self.spec.health)
        if self._connected and self._generation is None:
            self._register()  # now, not at its next batch: a quiet engine is routable again too

    def _engine_died(self, outcome: Outcome, detail: str) -> None:
        """Drops the engine's blocks: node_lost (an engine-only node goes
        down; beside a kvstore, only the engine's source is reset). The next
        batch after the revival starts over as a fresh subscription."""
        self._engine_dead = True
        self._tracker.lost_connection()
        since = (f"silent for {outcome.silent_s:.1f} s" if outcome.ever_answered
                 else "it never answered")
        reason = f"engine health {self.spec.health}: {outcome.failures} probes failed ({detail}; {since})"
        if self._generation is not None:
            self._sink.node_lost(self.spec.node_id, reason, self._generation)
            # It registers again, a new incarnation, when it answers: before that no batch may be applied
            # (an engine-only node is down: its events would be refused, which ends a feed).
            self._generation = None
        with self._lock:
            self._stats.deaths += 1
        log.warning("vLLM engine of %s declared dead (%s): its blocks leave the index%s", self.node_id, reason,
                    " (its kvstore's stay)" if self.spec.kvstore else ", the node goes down")

    def _on_message(self, frames: list[bytes]) -> None:
        try:
            sequence, payload = split_frames(frames)
        except BadInput as exc:
            self._count(exc.reason, 1, exc.detail)
            return
        plan = self._tracker.plan(sequence)
        if plan.reset:
            self._reset(plan.why, quiet=self._stats.batches == 0)
        if plan.replay_from is not None:
            self._catch_up(plan.replay_from, sequence, plan.why, fresh=plan.reset)
        self._apply(sequence, payload)

    def _catch_up(self, start: int, end: int, why: str, fresh: bool) -> None:
        """Applies [start, end) from the replay socket, or resets."""
        if not self.spec.replay_endpoint:
            if not fresh:
                log.warning("vLLM KV events of %s: %s and no replay endpoint; inventory reset", self.node_id, why)
                self._reset(why, quiet=True)
            return
        replayed = self._request_replay(start)
        run, complete = contiguous_run(replayed or [], start, end)
        if replayed is None or not complete:
            got = f"{run[0][0]}..{run[-1][0]}" if run else "nothing usable"
            level = logging.INFO if fresh else logging.WARNING
            log.log(level, "vLLM KV events of %s: %s; the replay returned %s, so the inventory is reset%s",
                    self.node_id, why, got, " and rebuilt from what it returned" if run else "")
            if not fresh:
                self._reset(why, quiet=True)
        else:
            with self._lock:
                self._stats.replays += 1
            log.info("vLLM KV events of %s: %s; caught up from the replay socket", self.node_id, why)
        for sequence, payload in run:
            self._apply(sequence, payload)

    def _request_replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """Every batch vLLM's ROUTER returns for sequences >= start, until its
        end marker; None when it does not answer in time or answers garbage
        (then the socket is dropped, so a late answer cannot be mistaken for
        the next one)."""
        if self._replay is None:
            self._replay = self._context.socket(zmq.DEALER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.connect(self.spec.replay_endpoint)
        replay = self._replay
        replay.send_multipart(replay_request(start))
        deadline = time.monotonic() + self._replay_timeout_s
        batches: list[tuple[int, bytes]] = []
        while not self._stop.is_set() and len(batches) < MAX_REPLAY_BATCHES:
            wait_ms = math.ceil((deadline - time.monotonic()) * 1000)
            if wait_ms <= 0 or not replay.poll(min(wait_ms, POLL_MS)):
                if wait_ms <= 0:
                    break
                continue
            try:
                item = split_replay_frames(replay.recv_multipart())
            except BadInput as exc:
                self._count(exc.reason, 1, exc.detail)
                break
            if item is None:
                return batches
            batches.append(item)
            deadline = time.monotonic() + self._replay_timeout_s  # the deadline is between frames
        log.warning("vLLM KV events of %s: replay from %s did not finish", self.node_id, self.spec.replay_endpoint)
        self._close_replay()
        return None

    def _close_replay(self) -> None:
        if self._replay is not None:
            self._replay.close(linger=0)
            self._replay = None

    def _apply(self, sequence: int, payload: bytes) -> None:
        self._tracker.applied(sequence)
        try:
            batch = self._decoder.decode(sequence, payload)
        except BadInput as exc:  # skipped, not a gap: a replay would decode no better
            self._count(exc.reason, 1, f"batch {sequence}: {exc.detail}")
            return
        for reason, count in batch.skipped.items():
            self._count(reason, count, f"batch {sequence}: {batch.details[reason]}")
        if batch.events and not self._sink.apply_kv_events(self.node_id, self._current(), batch.events):
            self._stale()
        with self._lock:
            self._stats.batches += 1
            self._stats.events += len(batch.events)

    def _reset(self, why: str, quiet: bool) -> None:
        if not self._sink.reset_inventory(self.node_id, self._current()):
            self._stale()
        if not quiet:
            log.warning("vLLM KV events of %s: %s; inventory reset", self.node_id, why)
        with self._lock:
            self._stats.resets += 1

    def _count(self, reason: Skip, count: int, detail: str) -> None:
        with self._lock:
            before = self._stats.skipped.get(reason.value, 0)
            after = self._stats.skipped[reason.value] = before + count
        if int(math.log10(after)) > (int(math.log10(before)) if before else -1):  # at 1, 10, 100, ...
            log.warning("vLLM KV events of %s: skipped (%s, %d so far): %s", self.node_id, reason.value, after,
                        detail)

    def _current(self) -> int:
        if self._generation is None:
            self._register()
        assert self._generation is not None
        return self._generation

    def _stale(self) -> None:
        log.warning("vLLM KV events of %s: the node was registered again by someone else; this feed ends",
                    self.node_id)
        raise _Stop


class VllmEventFeeds:
    """Owns one VllmNodeFeed per configured engine and their zmq context."""

    def __init__(self, specs: Sequence[VllmNodeSpec], sink: NodeSink, block_size: int,
                 heartbeat_interval_s: float, replay_timeout_s: float = 2.0,
                 beside_kvstore: NodeSink | None = None, health_rule: LivenessRule | None = None) -> None:
        """beside_kvstore: the sink of the engines named with kvstore=1
        (merged_sources.EngineSourceSink); sink serves the others.
        health_rule: how the engines named with health= are probed."""
        self._context = zmq.Context()
        self.feeds: dict[NodeId, VllmNodeFeed] = {}
        for s in specs:
            if s.kvstore and beside_kvstore is None:
                raise ValueError(f"kv_events node {s.node_id!r} has kvstore=1 and no sink for it was given")
            self.feeds[NodeId(s.node_id)] = VllmNodeFeed(
                s, beside_kvstore if s.kvstore and beside_kvstore is not None else sink, self._context,
                block_size, heartbeat_interval_s, replay_timeout_s, health_rule)

    def start(self) -> None:
        for feed in self.feeds.values():
            feed.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        for feed in self.feeds.values():
            feed.stop()
        ended = all([feed.join(timeout_s) for feed in self.feeds.values()])
        if ended:
            self._context.term()
        else:  # a thread still holds sockets: terminating would block on them
            log.warning("a vLLM KV event feed did not end within %.1f s; its zmq context is left open", timeout_s)

    def stats(self) -> dict[NodeId, FeedStats]:
        return {node: feed.stats() for node, feed in self.feeds.items()}
