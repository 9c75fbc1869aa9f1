"""KVStoreCore's disk tier (a base of KVStoreCore only; disk/ holds the
tier's parts): host evictions demoted to disk, disk hits staged up into the
host tier, re-indexing at start.

Demotion: a block the host tier evicts (and the device tier does not hold)
is copied, under the lock at memory speed, into a record buffer and offered
to the writer (disk/writer.py); the writer's thread later takes slots
(evicting the disk's LRU blocks: REMOVED(STORAGE)), writes the records
without the lock, then indexes them (STORED(STORAGE)). What the writer's
queue refuses is dropped and counted (disk counters' queue_dropped). A block
is invisible while queued: it left the host tier (REMOVED(CPU)) and is not
on the disk yet, so a lookup then misses it.

Staging (a disk hit, or a stage order: `stage`): the read paths (get_blocks, pin, promote, map_blocks,
hold) first bring the blocks only the disk holds up into the host tier: the
disk entries are pinned, their records read without the lock (disk/reader.py:
parallel, checked), then each valid one gets a host page (STORED(CPU); its
disk copy stays, touched). A block already being read up by another call
(a stage order in flight, another request) is not read twice: the second
call waits for that read to land (issue 44: a request arriving during a
stage of its blocks joins it rather than queue a read of its own behind it). A record that fails its check is taken off the
disk (REMOVED(STORAGE), checksum_failures) and is a miss: the caller gets
NotFound for it, as for any block the node does not hold, and recomputes.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import BlockHash
from speckv.services.common.tiers import Tier
from speckv.services.kvstore import validate
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.disk.medium import RecordMedium
from speckv.services.kvstore.disk.reader import DEFAULT_DEPTH, DEFAULT_REQUEST_BYTES, Outcome, RecordReader
from speckv.services.kvstore.disk.tier import DiskTier, PendingBlock
from speckv.services.kvstore.disk.writer import DEFAULT_BATCH, DEFAULT_CAPACITY, BackgroundWriter, InlineWriter
from speckv.services.kvstore.events import EventType
from speckv.services.kvstore.index import BlockEntry
from speckv.services.kvstore.pool import PageId
from speckv.services.kvstore.records import TierStats

if TYPE_CHECKING:
    from speckv.services.kvstore.store import KVStoreCore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DiskSettings:
    """The disk tier of a KVStoreCore. medium: where its records live
    (disk/medium.py; its record_bytes must be records.record_bytes of the
    geometry). request_bytes, depth: the reader's request size and requests
    in flight. queue_blocks: blocks the writer's queue holds at most;
    batch_blocks: blocks per write batch. inline: the writer runs inside the
    eviction, no thread (the simulator, tests: deterministic)."""

    medium: RecordMedium
    request_bytes: int = DEFAULT_REQUEST_BYTES
    depth: int = DEFAULT_DEPTH
    queue_blocks: int = DEFAULT_CAPACITY
    batch_blocks: int = DEFAULT_BATCH
    inline: bool = False


class DiskSide:
    """The disk tier's half of KVStoreCore (module docstring)."""

    def _open_disk(self: KVStoreCore, settings: DiskSettings | None) -> None:
        self._disk = None
        self._disk_writer = None
        self._disk_reads: dict[BlockHash, threading.Event] = {}  # blocks being read up, and when they land
        if settings is None:
            return
        if self._host is None:
            raise InvalidArgument("a disk tier needs a host tier above it (host_pages > 0)")
        bpb = self.geometry.bytes_per_block
        if settings.medium.record_bytes != records.record_bytes(bpb):
            raise InvalidArgument(f"disk medium: records of {settings.medium.record_bytes} bytes, the geometry's "
                                  f"are {records.record_bytes(bpb)}")
        digest = records.layout_digest(self.geometry)
        reader = RecordReader(settings.medium, digest, bpb, request_bytes=settings.request_bytes,
                              depth=settings.depth)
        disk = DiskTier(settings.medium, reader, digest, bpb)
        entries = disk.reindex()
        self._disk = disk
        self._emit_runs(EventType.STORED, Tier.DISK, entries[::-1])  # oldest first in; chains head first out
        self._disk_writer = (InlineWriter(self._write_disk_batch) if settings.inline else
                             BackgroundWriter(self._write_disk_batch, capacity=settings.queue_blocks,
                                              batch=settings.batch_blocks, name=f"{self.node_id}-disk-writer"))
        self._disk_writer.start()

    @property
    def has_disk_tier(self: KVStoreCore) -> bool:
        return self._disk is not None

    def disk_flush(self: KVStoreCore) -> None:
        """Waits until every block offered to the disk so far is written and
        indexed, or dropped (tests, a clean stop)."""
        if self._disk_writer is not None:
            self._disk_writer.flush()

    def disk_counters(self: KVStoreCore) -> dict[str, int]:
        with self._lock:
            return self._disk.counters.as_dict() if self._disk is not None else {}

    def _disk_stats(self: KVStoreCore) -> tuple[TierStats | None, dict[str, int]]:
        """The disk tier's slots as TierStats (used: indexed or being written) and its counters (lock held)."""
        disk = self._disk
        if disk is None:
            return None, {}
        slots, index = disk.num_slots, disk.index
        return (TierStats(slots, slots - len(disk.free), len(disk.free), index.pinned_count, 0, 0,
                          index.evictable_count, slots * disk.medium.record_bytes), disk.counters.as_dict())

    def _close_disk(self: KVStoreCore) -> None:
        if self._disk_writer is not None:
            self._disk_writer.stop()
        if self._disk is not None:
            self._disk.close()

    def _on_disk(self: KVStoreCore, block_hash: int) -> bool:
        return self._disk is not None and block_hash in self._disk.index

    def _offer_to_disk(self: KVStoreCore, victims: Sequence[BlockEntry]) -> set[BlockHash]:
        """Host victims (their pages still hold their bytes) to the writer;
        returns the hashes the disk keeps or will: those it holds already
        (touched) and those queued. The rest is the caller's to drop."""
        disk, host = self._disk, self._host
        if disk is None or host is None:
            return set()
        kept: set[BlockHash] = set()
        now = self.clock.now()
        for v in victims:
            if v.lease_deadline is not None and v.lease_deadline <= now:
                continue  # a lapsed replica is given back, as the device tier gives it back (writeback.py)
            if v.block_hash in self._index:
                continue  # the device tier keeps it; it comes down again when that tier evicts it
            if v.block_hash in disk.index:
                disk.index.touch(v.block_hash)
                kept.add(v.block_hash)
                continue
            record = disk.buffer()
            host.pool.pack([v.page], records.payload_of(record, self.bytes_per_block))
            if self._disk_writer.offer(PendingBlock(v.block_hash, record, v.family, v.parent)):  # type: ignore[union-attr]
                kept.add(v.block_hash)
            else:
                disk.give_back(record)
                disk.counters.queue_dropped += 1
        return kept

    def _write_disk_batch(self: KVStoreCore, batch: Sequence[PendingBlock]) -> None:
        """The writer's sink: slots (evicting), records written without the
        lock, then indexed; a failed write frees its slots and drops its blocks."""
        disk = self._disk
        assert disk is not None
        with self._lock:
            fresh = self._fresh_for_disk(batch)
            slots, victims = disk.take_slots(len(fresh), self.clock.now())
            self._disk_evicted(victims)
            for block in fresh[len(slots):]:  # every slot pinned: no room
                disk.give_back(block.record)
                self._dropped_total += 1
            fresh = fresh[:len(slots)]
            first = disk.sequence + 1
            disk.sequence += len(fresh)
        pairs = list(zip(slots, fresh))
        try:
            disk.write_records(pairs, range(first, first + len(pairs)))
        except OSError as exc:
            log.error("disk tier: writing %d records failed (%s); they are dropped", len(pairs), exc)
            with self._lock:
                disk.release(slots)
                disk.counters.write_failures += len(pairs)
                self._dropped_total += len(pairs)
                for block in fresh:
                    disk.give_back(block.record)
            return
        with self._lock:
            entries = [BlockEntry(b.block_hash, PageId(slot), b.family, b.parent) for slot, b in pairs]
            for entry in entries:
                disk.index.insert(entry)
            for block in fresh:
                disk.give_back(block.record)
            disk.counters.written += len(entries)
            self._emit_runs(EventType.STORED, Tier.DISK, entries[::-1])  # evicted tail first; events head first

    def _fresh_for_disk(self: KVStoreCore, batch: Sequence[PendingBlock]) -> list[PendingBlock]:
        """The batch less blocks the disk holds already (touched) and earlier
        duplicates (a block evicted twice while queued: the last copy wins)."""
        disk = self._disk
        assert disk is not None
        last = {b.block_hash: i for i, b in enumerate(batch)}
        fresh = []
        for i, block in enumerate(batch):
            if last[block.block_hash] != i or block.block_hash in disk.index:
                if block.block_hash in disk.index:
                    disk.index.touch(block.block_hash)
                disk.give_back(block.record)
                continue
            fresh.append(block)
        return fresh

    def _disk_evicted(self: KVStoreCore, victims: Sequence[BlockEntry]) -> None:
        if victims:
            self._dropped_total += sum(1 for v in victims if not self._holds(v.block_hash))
            self._events.append(EventType.REMOVED, tuple(v.block_hash for v in victims), medium=Tier.DISK.medium)

    def stage(self: KVStoreCore, hashes: Sequence[int]) -> int:
        """A stage order (issue 44): reads the blocks of hashes' leading run
        held here that only the disk tier holds into the host tier, exactly
        as a disk hit stages them before use (_stage_from_disk), and nothing
        further: no device copy, no use of the chain. Returns how many blocks
        it brought up (0 without a disk tier, or when the host or device
        tier holds them all already). InvalidArgument for a bad hash list."""
        wanted = validate.hash_list(hashes, "stage", self.max_hashes)
        return self._stage_from_disk(wanted)

    def _stage_from_disk(self: KVStoreCore, hashes: Sequence[BlockHash]) -> int:
        """Brings the blocks of hashes only the disk holds up into the host
        tier (module docstring); returns how many this call read. A block
        another call is reading already (a stage order's, another request's)
        is not read again: this call waits for that read to land. Call
        without the lock."""
        disk = self._disk
        if disk is None:
            return 0
        with self._lock:
            held = next((i for i, h in enumerate(hashes) if not (self._holds(h) or h in disk.index)), len(hashes))
            # past the first block held nowhere nothing is served: the read would be wasted
            wanted = [h for h in dict.fromkeys(hashes[:held]) if h in disk.index and not self._holds(h)]
            if not wanted:
                return 0
            flight = self._disk_reads
            joined = {id(e): e for e in (flight.get(h) for h in wanted) if e is not None}
            mine = [h for h in wanted if h not in flight]
            done = threading.Event()
            for h in mine:
                flight[h] = done
        try:
            staged = self._read_into_host(mine, hashes) if mine else 0
        finally:
            with self._lock:
                for h in mine:
                    if flight.get(h) is done:
                        del flight[h]
            done.set()
        for event in joined.values():
            event.wait()  # the other read lands its blocks in the host tier (or drops them: a miss)
        return staged

    def _read_into_host(self: KVStoreCore, wanted: list[BlockHash], hashes: Sequence[BlockHash]) -> int:
        """Reads wanted (held on the disk alone, registered as in flight)
        and stages the valid ones into the host tier; returns how many."""
        disk = self._disk
        assert disk is not None
        with self._lock:
            wanted = [h for h in wanted if h in disk.index]  # the writer may have evicted some meanwhile
            if not wanted:
                return 0
            for h in wanted:
                disk.index.pin(h)
            slots = [int(disk.index.get(h).page) for h in wanted]  # type: ignore[union-attr]
            buffers = [disk.buffer() for _ in wanted]  # recycled: no fresh pages to fault in per read
        try:
            reads = disk.reader.read(slots, buffers)
        except OSError as exc:  # the drive failed the read: a miss this time (the caller gets NotFound)
            log.error("disk tier: reading %d records failed: %s", len(slots), exc)
            return 0
        finally:
            with self._lock:
                for h in reversed(wanted):  # tail first back into the LRU (index.py)
                    disk.index.unpin(h)
        with self._lock:
            good = []
            for h, read in zip(wanted, reads):
                if read.outcome is Outcome.OK and read.header.block_hash == h:  # type: ignore[union-attr]
                    good.append((h, read))
                elif h in disk.index:
                    disk.drop(h)
                    disk.counters.checksum_failures += 1
                    self._disk_evicted([BlockEntry(h, PageId(0))])
            try:
                return self._stage_into_host([(h, r) for h, r in good if not self._holds(h) and h in disk.index],
                                             hashes)
            finally:
                for buffer in buffers:
                    disk.give_back(buffer)

    def _stage_into_host(self: KVStoreCore, good: list, hashes: Sequence[BlockHash]) -> int:
        """Checked records into new host pages (lock held); returns how many."""
        host, disk = self._host, self._disk
        assert host is not None and disk is not None
        if not good:
            return 0
        protect = [h for h in dict.fromkeys(hashes) if h in host.index]
        pages, _ = self._allocate_host(len(good), protect=protect, what="stage from disk")
        entries = []
        for (h, read), page in zip(good, pages):
            host.pool.unpack(read.payload, [page])
            entry = BlockEntry(h, page, read.header.family, read.header.parent)
            host.index.insert(entry)
            entries.append(entry)
        host.pool.seal(pages)
        disk.index.touch_chain([h for h, _ in good if h in disk.index])  # the writer may have evicted some meanwhile
        disk.counters.read += len(entries)
        self._emit_runs(EventType.STORED, Tier.HOST, entries)
        self._settle_retention()
        return len(entries)
