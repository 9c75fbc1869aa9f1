"""The disk tier's state: which block is in which slot (a BlockIndex, so
the disk evicts by the same policy as the memory tiers: eviction.py, LRU
here, as no replica lands on disk), the free slots, the record reader and
the counters. The store (store_disk.py) drives it under its lock; only
write_records and the reader's reads run outside it, on slots that the
lock handed out (taken, not yet indexed) or pinned.

Slots: every slot is in exactly one of the free list, the index (a valid
record, visible), or a write under way (taken by take_slots, indexed or
freed by the writer's commit). A block evicted from the disk leaves its
record in place until its slot is written again; re-indexing after a
restart may find it there and index it again (it is a valid block).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from speckv.services.common.ids import BlockHash
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.medium import RecordMedium
from speckv.services.kvstore.disk.reader import Outcome, RecordReader
from speckv.services.kvstore.disk.records import RecordHeader
from speckv.services.kvstore.index import BlockEntry, BlockIndex
from speckv.services.kvstore.pool import PageId


@dataclass(slots=True)
class PendingBlock:
    """A block on its way to disk: its bytes already in a record buffer
    (records.HEADER_BYTES on), the header still to be written."""

    block_hash: BlockHash
    record: np.ndarray
    family: str = ""
    parent: BlockHash | None = None


@dataclass(slots=True)
class DiskCounters:
    """Blocks since start (cumulative)."""

    written: int = 0  # records written and indexed
    read: int = 0  # records read and served (staged into the host tier)
    checksum_failures: int = 0  # records that failed their check when read: dropped, a miss
    foreign: int = 0  # records of another layout digest found at re-index: never served
    queue_dropped: int = 0  # host evictions the writer's queue could not take
    reindexed: int = 0  # records indexed again at start
    write_failures: int = 0  # blocks of batches whose write raised

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


@dataclass(slots=True)
class DiskTier:
    medium: RecordMedium
    reader: RecordReader
    digest: bytes
    payload_len: int
    index: BlockIndex = field(default_factory=BlockIndex)
    counters: DiskCounters = field(default_factory=DiskCounters)
    free: list[int] = field(default_factory=list)
    sequence: int = 0  # the last record's sequence number
    _spare: list[np.ndarray] = field(default_factory=list)

    @property
    def num_slots(self) -> int:
        return self.medium.slots

    @property
    def writing(self) -> int:
        """Slots taken by a write under way."""
        return self.num_slots - len(self.free) - len(self.index)

    def reindex(self) -> list[BlockEntry]:
        """Reads every slot (start-up only, before any other use) and
        indexes the valid records of this digest, oldest sequence first so
        the LRU order survives; a hash in two records keeps the newest.
        Returns the entries in the order indexed."""
        newest: dict[BlockHash, tuple[int, int, RecordHeader]] = {}
        for read in self.reader.scan():
            if read.outcome is Outcome.FOREIGN:
                self.counters.foreign += 1
            elif read.outcome is Outcome.CORRUPT:
                self.counters.checksum_failures += 1
            elif read.outcome is Outcome.OK:
                h = read.header
                assert h is not None
                self.sequence = max(self.sequence, h.sequence)
                if h.block_hash not in newest or newest[h.block_hash][0] < h.sequence:
                    newest[h.block_hash] = (h.sequence, read.slot, h)
        entries = [BlockEntry(h.block_hash, PageId(slot), h.family, h.parent)
                   for _, slot, h in sorted(newest.values(), key=lambda item: item[0])]
        for entry in entries:
            self.index.insert(entry)
        used = {e.page for e in entries}
        self.free = [s for s in reversed(range(self.num_slots)) if s not in used]
        self.counters.reindexed = len(entries)
        return entries

    def take_slots(self, count: int, now: float) -> tuple[list[int], list[BlockEntry]]:
        """Up to count slots for new records, evicting the LRU blocks the free
        slots fall short by (never pinned ones: fewer slots then). Returns
        (slots, the evicted entries); the slots are the caller's until
        commit or release."""
        victims: list[BlockEntry] = []
        while len(self.free) < count:
            victim = self.index.pop_victim(now)
            if victim is None:
                break
            victims.append(victim)
            self.free.append(int(victim.page))
        taken = min(count, len(self.free))
        slots = [self.free.pop() for _ in range(taken)]
        return slots, victims

    def release(self, slots: Sequence[int]) -> None:
        self.free.extend(slots)

    def drop(self, block_hash: BlockHash) -> None:
        """Takes an unpinned block off the disk index (its slot freed)."""
        entry = self.index.remove(block_hash)
        self.free.append(int(entry.page))

    def write_records(self, pairs: Sequence[tuple[int, PendingBlock]], sequences: Sequence[int]) -> None:
        """Each block's record, header and payload in one write, into its
        slot; then one sync for the batch (no lock needed: the slots are the
        caller's)."""
        for (slot, block), sequence in zip(pairs, sequences):
            payload = records.payload_of(block.record, self.payload_len)
            header = RecordHeader(block.block_hash, self.digest, sequence, self.payload_len,
                                  records.crc32c(payload), block.parent, block.family)
            records.encode_header(header, block.record)
            self.medium.write(slot * self.medium.record_bytes, block.record)
        if pairs:
            self.medium.sync()

    def buffer(self) -> np.ndarray:
        """A record-sized aligned buffer (recycled through give_back)."""
        if self._spare:
            return self._spare.pop()
        record = records.aligned_buffer(self.medium.record_bytes)
        record[records.HEADER_BYTES + self.payload_len:] = 0  # the padding, written as zeros once
        return record

    def give_back(self, record: np.ndarray) -> None:
        self._spare.append(record)

    def close(self) -> None:
        self.reader.close()
        self.medium.close()
