"""Live driver of the emulated engines: steps them on the real clock and
tells the scheduler their load.

One stepping thread advances every engine to the engine clock's now every
`poll_s` (2 ms) and hands the events to the caller's callback, outside the
lock. The engine clock is trace time: trace_s = start_s + (wall - origin) *
speed, so the engines run the real model's step times whatever the replay's
compression. One heartbeat thread sends Scheduler.Heartbeat for every node
every `heartbeat_s` with its queued/running tokens and waiting/running
requests only, so Route sees real queues; the node's free pages are its
kvstore agent's to report (the scheduler merges the fields each report
carries, so neither reporter wipes the other's figures).

Membership (issue 27's node events): `kill(node)` is the engine dying with
its kvstore: it never steps or heartbeats again, its jobs stay where they
were (the router re-sends them) and a submit to it is refused; `add(node,
engine)` starts serving a new node's engine from the next step.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Mapping

import grpc

from speckv.loadgen.engines.emulated import Engine, EngineEvent, EngineJob
from speckv.loadgen.workload.replay import TimeMap
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)
POLL_S = 0.002


class TraceClock:
    """Trace seconds from the wall clock through a TimeMap (wall = time.monotonic())."""

    def __init__(self, times: TimeMap) -> None:
        self._times = times

    def now(self) -> float:
        return self._times.to_trace(time.monotonic())


class LiveEngines:
    def __init__(self, engines: Mapping[str, Engine], clock: TraceClock, scheduler: grpc.Channel,
                 on_events: Callable[[list[EngineEvent]], None], heartbeat_s: float) -> None:
        self._engines = dict(engines)
        self._clock = clock
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(scheduler)
        self._on_events = on_events
        self._heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failed: set[str] = set()
        self._dead: set[str] = set()
        self._threads = [threading.Thread(target=self._step_loop, name="engines-step", daemon=True),
                         threading.Thread(target=self._heartbeat_loop, name="engines-heartbeat", daemon=True)]

    def start(self) -> "LiveEngines":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10.0)

    def node_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._engines)

    def now(self) -> float:
        """The engines' clock (trace seconds)."""
        return self._clock.now()

    def healthy(self, node_id: str) -> bool:
        with self._lock:
            return node_id in self._engines and node_id not in self._failed

    def kill(self, node_id: str) -> bool:
        """The node's engine dies now (module docstring); False when it was
        not serving."""
        with self._lock:
            if self._engines.pop(node_id, None) is None:
                return False
            self._dead.add(node_id)
            return True

    def add(self, node_id: str, engine: Engine) -> None:
        """A new node's engine serves from now on (an id is never reused)."""
        with self._lock:
            if node_id in self._engines or node_id in self._dead:
                raise ValueError(f"engine {node_id} exists or existed")
            self._engines[node_id] = engine

    def mark_failed(self, node_id: str) -> None:
        """The router saw this node fail: no more work goes to it."""
        with self._lock:
            self._failed.add(node_id)

    def submit(self, node_id: str, job: EngineJob) -> bool:
        """False when the node's engine is gone (killed): the job went nowhere."""
        with self._lock:
            engine = self._engines.get(node_id)
            if engine is None:
                return False
            now = self._clock.now()
            events = engine.advance(now)
            engine.submit(job, now)
        if events:
            self._on_events(events)
        return True

    def least_loaded(self, exclude: set[str]) -> str | None:
        with self._lock:
            loads = {n: e.load().queued_tokens for n, e in self._engines.items()
                     if n not in exclude and n not in self._failed}
        return min(loads, key=lambda n: (loads[n], n)) if loads else None

    def idle(self) -> bool:
        with self._lock:
            return all(e.next_event_s() is None for e in self._engines.values())

    def _step_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                now = self._clock.now()
                events = [ev for e in self._engines.values() for ev in e.advance(now)]
            if events:
                events.sort(key=lambda ev: ev.time_s)
                try:
                    self._on_events(events)
                except Exception:  # noqa: BLE001 - a callback bug must not stop every engine
                    log.exception("engine event callback failed")
            self._stop.wait(POLL_S)

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            for node_id in self.node_ids():
                with self._lock:
                    engine = self._engines.get(node_id)
                    if engine is None or node_id in self._failed:
                        continue
                    load = engine.load()
                try:
                    self._scheduler.Heartbeat(scheduler_pb2.HeartbeatRequest(
                        node_id=node_id, queued_tokens=load.queued_tokens, running_tokens=load.running_tokens,
                        num_running_requests=load.running_requests, num_waiting_requests=load.waiting_requests,
                        queued_prefill_ms=load.queued_prefill_ms), timeout=2.0)
                except grpc.RpcError as exc:
                    log.warning("heartbeat for %s failed: %s", node_id, exc.code().name)
            self._stop.wait(self._heartbeat_s)
