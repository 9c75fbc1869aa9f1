"""The disk tier's slots: LRU eviction when they run out (never a pinned
block), re-indexing that keeps the newest record of a hash and the order."""
from __future__ import annotations

from speckv.services.common.geometry import preset
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.medium import MemoryMedium
from speckv.services.kvstore.disk.reader import RecordReader
from speckv.services.kvstore.disk.tier import DiskTier, PendingBlock

TINY = preset("tiny")
BPB = TINY.bytes_per_block
DIGEST = records.layout_digest(TINY)


def tier(medium: MemoryMedium) -> DiskTier:
    disk = DiskTier(medium, RecordReader(medium, DIGEST, BPB, depth=2), DIGEST, BPB)
    disk.reindex()
    return disk


def store(disk: DiskTier, *hashes: int) -> None:
    from speckv.services.kvstore.index import BlockEntry
    slots, _ = disk.take_slots(len(hashes), 0.0)
    blocks = []
    for h in hashes:
        block = PendingBlock(h, disk.buffer())
        records.payload_of(block.record, BPB)[:] = h % 256
        blocks.append(block)
    first = disk.sequence + 1
    disk.sequence += len(hashes)
    disk.write_records(list(zip(slots, blocks)), range(first, first + len(hashes)))
    for slot, block in zip(slots, blocks):
        disk.index.insert(BlockEntry(block.block_hash, slot))


def test_slots_run_out_and_the_lru_block_goes_first_never_a_pinned_one():
    disk = tier(MemoryMedium(3, records.record_bytes(BPB)))
    store(disk, 1, 2, 3)
    disk.index.pin(1)
    slots, victims = disk.take_slots(2, 0.0)
    assert [v.block_hash for v in victims] == [2, 3] and len(slots) == 2
    slots_left, none = disk.take_slots(1, 0.0)
    assert slots_left == [] and none == []  # only the pinned block is left: no room, nothing evicted
    disk.close()


def test_reindex_keeps_the_newest_record_of_a_hash_in_sequence_order():
    medium = MemoryMedium(4, records.record_bytes(BPB))
    disk = tier(medium)
    store(disk, 1, 2)
    disk.index.remove(1)  # evicted, its record left in place
    disk.free.insert(0, 0)  # its slot is taken last: the old record stays
    store(disk, 3, 1)  # 1 written again, into another slot
    again = DiskTier(medium, RecordReader(medium, DIGEST, BPB), DIGEST, BPB)
    entries = again.reindex()
    assert [e.block_hash for e in entries] == [2, 3, 1] and again.index.eviction_order() == [2, 3, 1]
    assert again.sequence == 4 and len(again.free) == 1 and again.counters.reindexed == 3
    disk.close()
    again.reader.close()
