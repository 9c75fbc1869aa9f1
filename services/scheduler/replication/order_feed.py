"""Fan-out of issued orders, and of cancellations of issued orders (a copy in
state CANCELLED, so a source that already took the order drops it), to
WatchOrders streams.

Each watcher has its own bounded queue, filtered by source node ("" = all).
Publishing never blocks: a watcher whose queue is full is closed as
`overflowed` (its stream ends; the client reconnects and is re-sent the orders
still ISSUED), so one slow reader cannot stall the scheduler or the others.
`close_all()` ends every stream (server stop). Thread-safe.
"""
from __future__ import annotations

import queue
import threading

from speckv.services.common.ids import NodeId
from speckv.services.scheduler.orders import Order

_CLOSED = object()


class Watcher:
    def __init__(self, source: NodeId | None, capacity: int) -> None:
        self.source = source
        self._queue: queue.Queue[object] = queue.Queue(maxsize=capacity + 1)  # +1: room for _CLOSED
        self._capacity = capacity
        self._closed = threading.Event()
        self.overflowed = False

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def wants(self, order: Order) -> bool:
        return self.source is None or order.spec.source == self.source

    def offer(self, order: Order) -> bool:
        """Queues order; False (and closes) when the reader fell behind."""
        if self.closed:
            return False
        if self._queue.qsize() >= self._capacity:
            self.overflowed = True
            self.close()
            return False
        self._queue.put_nowait(order)
        return True

    def next(self, timeout: float) -> Order | None:
        """The next order, or None on timeout or once closed."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _CLOSED:
            self._queue.put_nowait(_CLOSED)  # keep answering None
            return None
        return item  # type: ignore[return-value]

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            try:
                self._queue.put_nowait(_CLOSED)
            except queue.Full:
                pass


class OrderFeed:
    def __init__(self, capacity: int = 1024) -> None:
        self._capacity = capacity
        self._watchers: set[Watcher] = set()
        self._lock = threading.Lock()
        self._closed = False

    def watch(self, source: NodeId | None, backlog: list[Order] = ()) -> Watcher:
        """A new watcher, primed with backlog (orders it should see first)."""
        watcher = Watcher(source, self._capacity)
        for order in backlog:
            watcher.offer(order)
        with self._lock:
            if self._closed:
                watcher.close()
            else:
                self._watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        watcher.close()
        with self._lock:
            self._watchers.discard(watcher)

    def publish(self, order: Order) -> int:
        """Offers order to matching watchers; returns how many took it."""
        with self._lock:
            watchers = [w for w in self._watchers if w.wants(order)]
        return sum(1 for w in watchers if w.offer(order))

    def num_watchers(self) -> int:
        with self._lock:
            return len(self._watchers)

    def close_all(self) -> None:
        with self._lock:
            self._closed = True
            watchers, self._watchers = self._watchers, set()
        for watcher in watchers:
            watcher.close()
