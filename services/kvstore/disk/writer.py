"""Write-back to the disk tier off the caller's path: a bounded queue and
one background thread that drains it in batches.

The host tier hands each block it evicts to offer(), which never blocks:
when the queue holds `capacity` blocks already the block is refused (the
caller drops it and counts it), so a slow drive costs blocks, never host
tier latency. The thread takes what is queued (up to `batch` blocks at a
time, waiting for the first) and hands the batch to the sink, which writes
the records and indexes them (store_disk.py). flush() waits until every
block offered before it has been through the sink (tests; a clean stop).

InlineWriter has the same interface and runs the sink inside offer(): the
simulator's choice (deterministic, timed in virtual time by its caller)
and a test's.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Generic, Protocol, Sequence, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)
DEFAULT_CAPACITY = 256  # blocks waiting at most (bounds the memory the queue pins: capacity x record bytes)
DEFAULT_BATCH = 32


class Writer(Protocol[T]):
    def offer(self, item: T) -> bool: ...
    def flush(self) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


class InlineWriter(Generic[T]):
    """The sink runs in offer(), one item per batch."""

    def __init__(self, sink: Callable[[Sequence[T]], None]) -> None:
        self._sink = sink

    def offer(self, item: T) -> bool:
        self._sink([item])
        return True

    def flush(self) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class BackgroundWriter(Generic[T]):
    """A bounded queue drained in batches by one daemon thread."""

    def __init__(self, sink: Callable[[Sequence[T]], None], *, capacity: int = DEFAULT_CAPACITY,
                 batch: int = DEFAULT_BATCH, name: str = "disk-writer") -> None:
        if capacity < 1 or batch < 1:
            raise ValueError(f"capacity={capacity}, batch={batch}: both must be >= 1")
        self._sink, self._batch = sink, batch
        self._queue: queue.Queue[T | None] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopping = False

    def offer(self, item: T) -> bool:
        """Queues item for the sink; False (nothing queued) when full or stopped."""
        if self._stopping:
            return False
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            return False
        return True

    def flush(self) -> None:
        self._queue.join()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Writes what is queued, then ends the thread."""
        if self._stopping:
            return
        self._stopping = True
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            items = [first]
            while len(items) < self._batch:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            batch = [i for i in items if i is not None]
            try:
                if batch:
                    self._sink(batch)
            except Exception:  # noqa: BLE001 - a failed batch loses its blocks, never the thread
                log.exception("disk tier: a write batch of %d blocks failed; they are dropped", len(batch))
            finally:
                for _ in items:
                    self._queue.task_done()
            if len(batch) < len(items):
                return
