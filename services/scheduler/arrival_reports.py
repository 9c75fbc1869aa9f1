"""Arrival reports to the predictor, batched and off the request path.

Route calls `offer()`, which never blocks: the arrival goes into a bounded
queue, or is dropped (and counted) when the queue is full. A background
thread takes up to `batch_max` arrivals at a time (waiting at most `flush_s`
for the first) and hands them to a sender (one ObserveArrivals call per batch
in the live cluster). A failed send drops that batch (counted) and backs off,
doubling from `backoff_s` up to `backoff_max_s`, so a predictor that is down
costs Route nothing and the scheduler little. Thread-safe.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)
_STOP = object()


@dataclass(frozen=True, slots=True)
class ArrivalRecord:
    time_s: float  # scheduler clock, seconds
    family: str
    node_id: str
    prompt_tokens: int
    cached_tokens: int


class ArrivalSender(Protocol):
    def send(self, batch: list[ArrivalRecord]) -> None:
        """Delivers batch or raises."""
        ...


@dataclass(slots=True)
class ArrivalStats:
    offered: int = 0
    sent: int = 0
    dropped_full: int = 0
    dropped_send: int = 0
    batches: int = 0


class ArrivalReporter:
    def __init__(self, sender: ArrivalSender, capacity: int = 10_000, batch_max: int = 512,
                 flush_s: float = 0.2, backoff_s: float = 0.1, backoff_max_s: float = 5.0) -> None:
        self._sender = sender
        self._queue: queue.Queue[object] = queue.Queue(maxsize=capacity)
        self._batch_max = batch_max
        self._flush_s = flush_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stats = ArrivalStats()
        self._thread = threading.Thread(target=self._run, name="scheduler-arrivals", daemon=True)

    def start(self) -> "ArrivalReporter":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            pass  # the thread is awake anyway: the queue has work
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def offer(self, arrival: ArrivalRecord) -> bool:
        """Queues arrival; False (counted as dropped) when the queue is full."""
        with self._lock:
            self._stats.offered += 1
        if self._stop.is_set():
            return False
        try:
            self._queue.put_nowait(arrival)
            return True
        except queue.Full:
            with self._lock:
                self._stats.dropped_full += 1
            return False

    def stats(self) -> ArrivalStats:
        with self._lock:
            s = self._stats
            return ArrivalStats(s.offered, s.sent, s.dropped_full, s.dropped_send, s.batches)

    def _run(self) -> None:
        backoff = self._backoff_s
        failing = False
        while not self._stop.is_set():
            batch = self._next_batch()
            if not batch:
                continue
            try:
                self._sender.send(batch)
            except Exception as exc:  # noqa: BLE001 - any failure drops the batch, never the thread
                with self._lock:
                    self._stats.dropped_send += len(batch)
                if not failing:
                    log.warning("arrival reports failing (dropping batches until the predictor answers): %s", exc)
                failing = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max_s)
                continue
            if failing:
                log.info("arrival reports flowing again")
            failing, backoff = False, self._backoff_s
            with self._lock:
                self._stats.sent += len(batch)
                self._stats.batches += 1

    def _next_batch(self) -> list[ArrivalRecord]:
        try:
            first = self._queue.get(timeout=self._flush_s)
        except queue.Empty:
            return []
        batch: list[ArrivalRecord] = []
        item: object = first
        while item is not _STOP:
            batch.append(item)  # type: ignore[arg-type]
            if len(batch) >= self._batch_max:
                break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        return batch
