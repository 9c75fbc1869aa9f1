"""A bounded queue drained in batches by one background thread: how the
client sends reports (arrivals, turn ends) off the request path.

offer() never blocks and never raises: a full queue, or one already closed,
drops the item and counts it. The thread takes up to `batch_max` items at a
time, waiting at most `flush_s` for more after the first, and hands each
batch to the sender; a sender that raises fails that batch (counted, logged
once per outage), never the thread. close() sends what is queued, then stops.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from speckv.services.common.errors import require

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """batch_max items per send (>= 1); flush_s: the longest a partial batch
    waits for more (s, > 0); capacity: items queued at most (>= 1)."""

    batch_max: int = 256
    flush_s: float = 0.2
    capacity: int = 10_000

    def __post_init__(self) -> None:
        require(self.batch_max >= 1, f"batch_max must be >= 1, not {self.batch_max}")
        require(self.flush_s > 0, f"flush_s must be > 0, not {self.flush_s}")
        require(self.capacity >= 1, f"capacity must be >= 1, not {self.capacity}")


@dataclass(slots=True)
class BatchStats:
    offered: int = 0
    sent: int = 0  # items in batches the sender took
    failed: int = 0  # items in batches the sender raised on (dropped)
    dropped: int = 0  # never queued: the queue was full, or closed
    batches: int = 0  # batches sent


_STOP = object()


class BatchQueue(Generic[T]):
    """The module docstring's queue; `name` names its thread and its log lines."""

    def __init__(self, name: str, send: Callable[[list[T]], None], settings: BatchSettings = BatchSettings()) -> None:
        self._name, self._send, self._settings = name, send, settings
        self._queue: queue.Queue[object] = queue.Queue(maxsize=settings.capacity)
        self._stats = BatchStats()
        self._lock = threading.Lock()
        self._closed = False
        self._failing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def offer(self, item: T) -> bool:
        """Queues item; False (and counted as dropped) when full or closed."""
        with self._lock:
            self._stats.offered += 1
            if self._closed:
                self._stats.dropped += 1
                return False
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            with self._lock:
                self._stats.dropped += 1
            return False
        return True

    def reject(self) -> bool:
        """Counts an item that could not even be built (offered and dropped); False."""
        with self._lock:
            self._stats.offered += 1
            self._stats.dropped += 1
        return False

    def stats(self) -> BatchStats:
        with self._lock:
            s = self._stats
            return BatchStats(s.offered, s.sent, s.failed, s.dropped, s.batches)

    def close(self, timeout_s: float = 10.0) -> None:
        """Sends what is queued (waiting up to timeout_s), then stops the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            log.warning("%s: the queue stayed full for %g s at close; its items are dropped", self._name, timeout_s)
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                return
            batch: list[T] = [first]  # type: ignore[list-item]
            while len(batch) < self._settings.batch_max:
                try:
                    item = self._queue.get(timeout=self._settings.flush_s)
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)  # type: ignore[arg-type]
            self._deliver(batch)

    def _deliver(self, batch: list[T]) -> None:
        try:
            self._send(batch)
        except Exception as exc:  # noqa: BLE001 - a report is best effort; the thread must live on
            if not self._failing:
                log.warning("%s: a batch of %d failed (%s); its items are dropped until sends succeed again",
                            self._name, len(batch), exc)
            self._failing = True
            with self._lock:
                self._stats.failed += len(batch)
            return
        self._failing = False
        with self._lock:
            self._stats.sent += len(batch)
            self._stats.batches += 1
