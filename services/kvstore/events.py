"""KV event log of one node: what became resident, what left, what a
replication handshake committed (the shape of vLLM's BlockStored /
BlockRemoved events, plus COMMITTED and SNAPSHOT).

Invariants:
- sequences start at 1 and increase by exactly 1 per event; events are
  appended while the store holds its lock, so sequence order is state order;
- the last `retention` events are kept; older ones are dropped;
- a reader that cannot be served by deltas alone (it starts from 0 while blocks
  are resident, it asks for a sequence older than what is retained, it falls
  behind retention while connected, or it names a sequence from the future,
  e.g. of an earlier run of this node) first gets a SNAPSHOT listing every
  resident block as of sequence S, then the deltas after S;
- every event names the tier it is about by its medium ("GPU", "CPU",
  "STORAGE": services/common/tiers.py); a SNAPSHOT lists the device tier's
  blocks in block_hashes, the host tier's in host_block_hashes and the disk
  tier's in disk_block_hashes.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable, Iterator

from speckv.services.common.clock import Clock
from speckv.services.common.ids import BlockHash

# Resident hashes of the device tier, the last sequence they reflect, the
# host tier's hashes and (optionally) the disk tier's, read atomically.
SnapshotFn = Callable[[], tuple[list[BlockHash], int, list[BlockHash]] |
                      tuple[list[BlockHash], int, list[BlockHash], list[BlockHash]]]
BATCH = 1024  # events handed out per wake-up, so one reader never holds the lock long


class EventType(IntEnum):
    """Values match speckv.v1.KVEventType."""

    STORED = 1
    REMOVED = 2
    COMMITTED = 3
    SNAPSHOT = 4


@dataclass(frozen=True, slots=True)
class KVEvent:
    sequence: int
    type: EventType
    block_hashes: tuple[BlockHash, ...]
    time_s: float  # node clock
    node_id: str
    block_size: int
    parent: BlockHash | None = None
    family: str = ""
    order_id: str = ""  # COMMITTED only
    medium: str = "GPU"  # the tier: services/common/tiers.py
    host_block_hashes: tuple[BlockHash, ...] = ()  # SNAPSHOT only: the host tier's blocks
    disk_block_hashes: tuple[BlockHash, ...] = ()  # SNAPSHOT only: the disk tier's blocks


class EventLog:
    """Bounded, thread-safe, blocking-readable event log."""

    def __init__(self, node_id: str, block_size: int, retention: int, clock: Clock) -> None:
        if retention <= 0:
            raise ValueError(f"retention={retention}: must be > 0")
        self._node_id = node_id
        self._block_size = block_size
        self._clock = clock
        self._events: deque[KVEvent] = deque(maxlen=retention)
        self._last = 0
        self._cond = threading.Condition()
        self._closed = False

    @property
    def last_sequence(self) -> int:
        with self._cond:
            return self._last

    def append(
        self, kind: EventType, hashes: tuple[BlockHash, ...], *, parent: BlockHash | None = None,
        family: str = "", order_id: str = "", medium: str = "GPU",
    ) -> KVEvent:
        with self._cond:
            self._last += 1
            event = KVEvent(self._last, kind, hashes, self._clock.now(), self._node_id,
                            self._block_size, parent, family, order_id, medium)
            self._events.append(event)
            self._cond.notify_all()
            return event

    def close(self) -> None:
        """Ends every subscription (they return after their current batch)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def subscribe(
        self, after_sequence: int, snapshot: SnapshotFn, keep_going: Callable[[], bool] = lambda: True,
        poll_s: float = 0.5,
    ) -> Iterator[KVEvent]:
        """Events with sequence > after_sequence, blocking for new ones.

        Ends when the log is closed or keep_going() turns false (checked at
        least every poll_s seconds while idle; no busy waiting).
        """
        cursor = after_sequence
        first = True
        while True:
            with self._cond:
                if self._closed or not keep_going():
                    return
                retained_from = self._events[0].sequence if self._events else self._last + 1
                stale = cursor < retained_from - 1 or cursor > self._last or (first and cursor == 0)
                batch = [] if stale else self._after(cursor)
                if not stale and not batch:
                    self._cond.wait(poll_s)
                    first = False
                    continue
            first = False
            if stale:
                hashes, cursor, host, *disk = snapshot()
                if hashes or host or any(disk) or after_sequence != 0:
                    yield self._snapshot_event(hashes, cursor, host, disk[0] if disk else [])
                continue
            yield from batch
            cursor = batch[-1].sequence

    def _after(self, cursor: int) -> list[KVEvent]:
        """Up to BATCH retained events after cursor (caller holds the lock)."""
        if not self._events or cursor >= self._last:
            return []
        start = cursor + 1 - self._events[0].sequence
        stop = min(len(self._events), start + BATCH)
        return [self._events[i] for i in range(start, stop)]

    def _snapshot_event(self, hashes: list[BlockHash], sequence: int, host: list[BlockHash],
                        disk: list[BlockHash]) -> KVEvent:
        return KVEvent(sequence, EventType.SNAPSHOT, tuple(hashes), self._clock.now(),
                       self._node_id, self._block_size, host_block_hashes=tuple(host),
                       disk_block_hashes=tuple(disk))
