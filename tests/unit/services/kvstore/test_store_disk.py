"""KVStoreCore with a disk tier: host evictions go down to disk instead of
being lost, a disk hit comes back up, a restart re-indexes the disk, a
damaged record or another model's is never served, and capacity and
eviction order hold in all three tiers."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import InvalidArgument, NotFound
from speckv.services.common.geometry import preset
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.medium import FileMedium, MemoryMedium
from speckv.services.kvstore.events import EventType
from speckv.services.kvstore.records import BlockWrite
from speckv.services.kvstore.store import KVStoreCore
from speckv.services.kvstore.store_disk import DiskSettings

TINY = preset("tiny")
BPB = TINY.bytes_per_block
RECORD = records.record_bytes(BPB)


def data(h: int) -> np.ndarray:
    return np.random.default_rng(h).integers(0, 256, BPB, dtype=np.uint8)


def core(medium, *, device: int = 2, host: int = 2, inline: bool = True, geometry=TINY, **disk) -> KVStoreCore:
    return KVStoreCore("n0", geometry, device, ManualClock(), host_pages=host,
                       disk=DiskSettings(medium, inline=inline, **disk))


def put(store: KVStoreCore, *hashes: int) -> None:
    for h in hashes:
        store.put_blocks([BlockWrite(h, data(h), family="f")])


def read(store: KVStoreCore, h: int) -> bytes:
    return next(iter(store.get_blocks([h])))[1].tobytes()


def tiers(store: KVStoreCore, *hashes: int) -> list[Tier | None]:
    return [store.tier_of(h) for h in hashes]


def events(store: KVStoreCore) -> list:
    """The log's events after the first (from 0 a subscriber gets a snapshot instead)."""
    out = []
    for event in store.subscribe(1, poll_s=0.01):
        out.append(event)
        if event.sequence >= store.stats().last_event_sequence:
            return out
    return out


def test_host_evictions_go_down_to_disk_instead_of_being_lost():
    store = core(MemoryMedium(4, RECORD))
    put(store, 1, 2, 3, 4, 5, 6)  # device 2, host 2: 1 and 2 leave the host tier
    assert tiers(store, 1, 2, 3, 4, 5, 6) == [Tier.DISK] * 2 + [Tier.HOST] * 2 + [Tier.DEVICE] * 2
    stats = store.stats()
    assert stats.blocks_dropped_total == 0 and stats.disk.used_pages == 2 and store.disk_counters()["written"] == 2
    assert store.lookup([1, 2, 3]).prefix_blocks == 3  # a disk block is a hit
    stored = [e for e in events(store) if e.medium == "STORAGE"]
    assert {h for e in stored for h in e.block_hashes} == {1, 2} and stored[0].type is EventType.STORED


def test_without_a_disk_tier_host_evictions_are_dropped_as_before():
    store = KVStoreCore("n0", TINY, 2, ManualClock(), host_pages=2)
    put(store, 1, 2, 3, 4, 5, 6)
    assert tiers(store, 1, 2) == [None, None] and store.stats().blocks_dropped_total == 2
    assert store.stats().disk is None


def test_a_disk_hit_comes_up_to_the_host_tier_and_on_to_the_device():
    store = core(MemoryMedium(4, RECORD))
    put(store, 1, 2, 3, 4, 5, 6)
    assert read(store, 1) == data(1).tobytes()
    assert store.tier_of(1) is Tier.HOST and store.disk_counters()["read"] == 1
    assert store.promote([2]) == 1 and store.tier_of(2) is Tier.DEVICE  # disk -> host -> device
    assert read(store, 2) == data(2).tobytes()
    assert store.stats().blocks_dropped_total == 0  # what the staging pushed out of the host went down to disk


def test_the_disk_evicts_its_least_recently_used_block_and_counts_it_dropped():
    store = core(MemoryMedium(2, RECORD))
    put(store, 1, 2, 3, 4, 5, 6)
    store.lookup([2])  # a use: 1 is now the disk's oldest
    put(store, 7)  # 3 leaves the host tier for the disk, which makes room by evicting 1
    assert tiers(store, 1, 2, 3) == [None, Tier.DISK, Tier.DISK] and store.stats().blocks_dropped_total == 1
    removed = [e for e in events(store) if e.type is EventType.REMOVED and e.medium == "STORAGE"]
    assert [e.block_hashes for e in removed] == [(1,)]


def test_capacity_holds_in_all_three_tiers():
    store = core(MemoryMedium(3, RECORD), device=2, host=3)
    put(store, *range(1, 21))
    stats = store.stats()
    assert (stats.device.used_pages, stats.host.used_pages, stats.disk.used_pages) == (2, 3, 3)
    assert stats.blocks_dropped_total == 20 - 8
    assert tiers(store, 20, 19, 18, 17, 16, 15, 14, 13, 12) == [Tier.DEVICE] * 2 + [Tier.HOST] * 3 + \
        [Tier.DISK] * 3 + [None]


def test_a_damaged_record_is_a_miss_and_is_never_served():
    medium = MemoryMedium(4, RECORD)
    store = core(medium)
    put(store, 1, 2, 3, 4, 5, 6)
    slot = store._disk.index.get(1).page
    medium._data[slot * RECORD + records.HEADER_BYTES + 3] ^= 0xFF
    with pytest.raises(NotFound, match="1"):
        list(store.get_blocks([1]))
    assert store.tier_of(1) is None and store.disk_counters()["checksum_failures"] == 1
    assert store.lookup([1]).prefix_blocks == 0  # gone: the engine recomputes it
    assert read(store, 2) == data(2).tobytes()  # its neighbour is fine


def test_a_restart_reindexes_the_disk_and_announces_it(tmp_path: Path):
    store = core(FileMedium(tmp_path, 4, RECORD), inline=False)
    put(store, 1, 2, 3, 4, 5, 6)
    store.disk_flush()
    store.close()
    again = core(FileMedium(tmp_path, 4, RECORD), inline=False)
    try:
        assert tiers(again, 1, 2, 3) == [Tier.DISK, Tier.DISK, None]
        assert again.disk_counters()["reindexed"] == 2 and read(again, 1) == data(1).tobytes()
        snapshot = next(iter(again.subscribe(0)))
        assert snapshot.type is EventType.SNAPSHOT and snapshot.host_block_hashes == (1,) and set(snapshot.disk_block_hashes) == {1, 2}  # 1 is on host too now
    finally:
        again.close()


def test_another_models_records_are_never_served(tmp_path: Path):
    store = core(FileMedium(tmp_path, 4, RECORD))
    put(store, 1, 2, 3, 4, 5, 6)
    store.close()
    other = preset("tiny", 32)  # the same record size would not matter: the digest differs
    other_record = records.record_bytes(other.bytes_per_block)
    again = core(FileMedium(tmp_path, 4, other_record), geometry=other)
    try:
        assert tiers(again, 1, 2) == [None, None] and again.disk_counters()["foreign"] == 2
    finally:
        again.close()


def test_what_the_writer_queue_cannot_take_is_dropped_and_counted():
    store = core(MemoryMedium(8, RECORD), inline=False, queue_blocks=1)
    store._disk_writer.stop()  # nothing drains the queue now: it holds one block, refuses the rest
    store._disk_writer._stopping = False
    put(store, 1, 2, 3, 4, 5, 6, 7)
    assert store.disk_counters()["queue_dropped"] == 2 and store.stats().blocks_dropped_total == 2


def test_a_disk_tier_needs_a_host_tier_and_no_order_reserves_on_it():
    with pytest.raises(InvalidArgument, match="host tier"):
        core(MemoryMedium(2, RECORD), host=0)
    store = core(MemoryMedium(2, RECORD))
    with pytest.raises(InvalidArgument, match="STORAGE"):
        store.reserve("o1", [9], 1.0, tier=Tier.DISK)


@pytest.mark.parametrize("cut", [100, records.HEADER_BYTES, records.HEADER_BYTES + 100, records.HEADER_BYTES + BPB // 2])
def test_a_record_torn_at_any_point_is_never_indexed(tmp_path: Path, cut: int):
    store = core(FileMedium(tmp_path, 4, RECORD))
    put(store, 1, 2, 3, 4, 5, 6)
    slot = store._disk.index.get(1).page
    store.close()
    torn = records.aligned_buffer(RECORD)  # a new record of block 99 for slot 1's place, cut short by a crash
    records.payload_of(torn, BPB)[:] = data(99)
    header = records.RecordHeader(99, records.layout_digest(TINY), 10, BPB, records.crc32c(data(99)))
    records.encode_header(header, torn)
    with open(tmp_path / "speckv-blocks.dat", "r+b") as f:
        f.seek(slot * RECORD)
        f.write(torn[:cut].tobytes())
    again = core(FileMedium(tmp_path, 4, RECORD))
    try:
        assert tiers(again, 1, 2, 99) == [None, Tier.DISK, None]
        assert again.disk_counters()["checksum_failures"] == 1
    finally:
        again.close()


def test_a_stage_order_reads_disk_blocks_into_the_host_tier_only():
    """stage (issue 44's staging ahead of a return): the leading run's
    disk-only blocks come up into the host tier, checked, as a disk hit's
    do; the device tier is untouched; what the host pushes out goes down."""
    store = core(MemoryMedium(4, RECORD))
    put(store, 1, 2, 3, 4, 5, 6)  # 1, 2 on the disk; 3, 4 host; 5, 6 device
    assert store.stage([1, 2, 99]) == 2
    assert tiers(store, 1, 2, 3, 4, 5, 6) == [Tier.HOST] * 2 + [Tier.DISK] * 2 + [Tier.DEVICE] * 2
    assert store.disk_counters()["read"] == 2 and store.stats().blocks_dropped_total == 0
    assert read(store, 1) == data(1).tobytes()
    assert store.stage([1, 5]) == 0  # held above the disk already: nothing to read
    assert store.stage([99]) == 0
    with pytest.raises(InvalidArgument):
        store.stage([])


def test_without_a_disk_tier_a_stage_brings_up_nothing():
    store = KVStoreCore("n0", TINY, 2, ManualClock(), host_pages=2)
    put(store, 1, 2, 3)
    assert store.stage([1, 2, 3]) == 0


class GatedMedium(MemoryMedium):
    """A MemoryMedium whose reads hold until `gate` opens (a slow drive),
    counting the bytes read."""

    def __init__(self, slots: int, record_bytes: int) -> None:
        super().__init__(slots, record_bytes)
        self.gate = threading.Event()
        self.gate.set()
        self.reading = threading.Event()
        self.bytes_read = 0

    def read(self, offset: int, into: np.ndarray) -> int:
        self.reading.set()
        assert self.gate.wait(10), "the gate never opened"
        n = super().read(offset, into)
        self.bytes_read += n
        return n


def test_a_request_arriving_while_a_stage_reads_its_blocks_joins_that_read():
    """Issue 44 (b): a get of blocks a stage order is reading off the disk
    waits for that read rather than reading them again behind it: the
    blocks are read once, and the get returns them whole once it lands."""
    medium = GatedMedium(4, RECORD)
    store = core(medium)
    put(store, 1, 2, 3, 4, 5, 6)  # 1, 2 on the disk
    medium.gate.clear()
    medium.reading.clear()
    medium.bytes_read = 0
    staging = threading.Thread(target=store.stage, args=([1, 2],))
    staging.start()
    assert medium.reading.wait(10)  # the stage's read is in flight, held at the gate
    got: dict[int, bytes] = {}
    getter = threading.Thread(target=lambda: got.update((h, a.tobytes()) for h, a in store.get_blocks([1, 2])))
    getter.start()
    getter.join(0.2)
    assert getter.is_alive() and not got  # waiting for the stage, not served early
    medium.gate.set()
    staging.join(10)
    getter.join(10)
    assert got == {1: data(1).tobytes(), 2: data(2).tobytes()}
    assert medium.bytes_read == 2 * RECORD  # each record read once
    assert store.disk_counters()["read"] == 2


def test_a_failed_read_releases_the_calls_that_joined_it():
    """A stage whose read finds a damaged record lets the call that joined
    it go on: the block is a miss (NotFound, the engine recomputes), never
    a hang."""
    medium = GatedMedium(4, RECORD)
    store = core(medium)
    put(store, 1, 2, 3, 4, 5, 6)
    slot = store._disk.index.get(1).page
    medium._data[slot * RECORD + records.HEADER_BYTES + 3] ^= 0xFF  # block 1's record is damaged
    medium.gate.clear()
    medium.reading.clear()
    staging = threading.Thread(target=store.stage, args=([1, 2],))
    staging.start()
    assert medium.reading.wait(10)
    outcome: list[object] = []

    def get() -> None:
        try:
            outcome.append(len(list(store.get_blocks([1, 2]))))
        except NotFound as exc:
            outcome.append(exc)

    getter = threading.Thread(target=get)
    getter.start()
    medium.gate.set()
    staging.join(10)
    getter.join(10)
    assert not getter.is_alive() and len(outcome) == 1 and isinstance(outcome[0], NotFound)
    assert store.disk_counters()["checksum_failures"] == 1 and store.tier_of(1) is None
