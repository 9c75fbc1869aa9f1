"""KVStoreCore: one node's KV store, composing its tiers (each a pool, an
index and a reservation book; tier.py), the event log and the page mover
behind one lock. Its parts: records.py (what it takes and returns),
writeback.py (room-making, eviction and demotion between the tiers) and
store_replicas.py (both ends of replication), store_shared.py (same-host
peers reading and writing pages in shared memory), store_disk.py (the disk
tier below the host tier: disk/); eviction order: index.py and eviction.py.

Tiers: every node has a device tier; with host_pages > 0 it also has a host
tier below it. A block is in one tier or both. A block the device tier
evicts by LRU is demoted to the host tier (write-back: its bytes are copied
down before its device page is freed), where it becomes the most recent
block; a speculative replica whose lease lapsed is dropped, not demoted (a
wrong guess is given back). The host tier evicts by the same policy
(eviction.py), so a chain leaves it tail first too. `promote` copies a
prefix's host-only blocks up into the device tier (the host copy stays) and
is what a route's host hit waits for before prefill. Reads (lookups, reads,
replication sources) see both tiers; a put stores into the device tier; a
reservation names its tier (device or host). With a disk tier (disk,
store_disk.py) host evictions go down to it and the read paths first stage
what only the disk holds up into the host tier; a lookup counts a disk
block as a hit.

Invariants:
- every page of each tier is in exactly one of: its free stack, its index
  (visible), an open reservation (invisible until commit), or a put, demotion
  or promotion being written under the lock (never observable);
- a request that fails changes nothing already stored: inputs are validated
  and room is found (evicting only as many blocks as needed, never pinned
  ones, never blocks the request itself names) before anything is written;
- every state change that readers care about is appended to the event log
  while the lock is held, so event order is state order; events carry their
  tier's medium ("GPU", "CPU", "STORAGE" for the disk), and a demotion is STORED(CPU) before
  REMOVED(GPU), so a reader never sees the block leave the node.

Thread-safe: every public method takes the lock. Byte copies run under it too
(a block is at most a few MiB: tens to hundreds of microseconds), except the
zero-copy data plane's socket reads and sends: begin_write hands out views of
reserved pages that the reservation book keeps from being freed until
finish_write / cancel_write, and source_chunk hands out views of pages the
caller holds pinned (hold), so neither can be reused underneath.
"""
from __future__ import annotations

import heapq
import math
import threading
from typing import Callable, Iterator, Sequence

import numpy as np

from speckv.kernels.backend import Backend, NumpyBackend
from speckv.services.common.clock import Clock
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import BlockHash
from speckv.services.common.retention import Retention
from speckv.services.common.tiers import Tier
from speckv.services.kvstore import validate
from speckv.services.kvstore.events import EventLog, EventType, KVEvent
from speckv.services.kvstore.index import BlockEntry, BlockIndex
from speckv.services.kvstore.pool import Buffer, PageId, PagePool, bytes_view
from speckv.services.kvstore.records import BlockWrite, LookupResult, PutResult, StoreStats, TierStats
from speckv.services.kvstore.reservations import ReservationBook
from speckv.services.kvstore.store_disk import DiskSettings, DiskSide
from speckv.services.kvstore.store_replicas import ReplicaSides
from speckv.services.kvstore.store_shared import SharedPages
from speckv.services.kvstore.tier import PageMover, StoreTier
from speckv.services.kvstore.writeback import WriteBack


class KVStoreCore(ReplicaSides, SharedPages, WriteBack, DiskSide):
    def __init__(
        self, node_id: str, geometry: KVGeometry, num_pages: int, clock: Clock, *,
        event_retention: int = 100_000, max_hashes_per_request: int = 65_536, backend: Backend | None = None,
        host_pages: int = 0, host_backend: Backend | None = None, retain_max_share: float = 0.0,
        disk: DiskSettings | None = None,
    ) -> None:
        """num_pages: the device tier's blocks; backend: where they live (None:
        host memory through NumPy). host_pages: the host tier's blocks (0:
        none); host_backend: its memory (None: NumPy, unpinned).
        retain_max_share: at most this share of the last tier's pages (host,
        else device) is retained at once (0: retain retains nothing).
        disk: the disk tier below the host tier (store_disk.py; None: none);
        its records are re-indexed here, before any call."""
        self.node_id = validate.identifier(node_id, "node_id")
        if host_pages < 0:
            raise InvalidArgument(f"host_pages={host_pages}: must be >= 0 (0: no host tier)")
        if not 0.0 <= retain_max_share < 1.0:
            raise InvalidArgument(f"retain_max_share={retain_max_share}: must be in [0, 1)")
        self.geometry = geometry
        self.clock = clock
        self.max_hashes = max_hashes_per_request
        self._lock = threading.RLock()
        self._device = self._make_tier(Tier.DEVICE, num_pages, backend, node_id)
        self._host = (self._make_tier(Tier.HOST, host_pages, host_backend or NumpyBackend(), f"{node_id}-host")
                      if host_pages else None)
        self._pool, self._index, self._book = self._device.pool, self._device.index, self._device.book
        self._mover = PageMover(geometry.bytes_per_block, (host_backend or self._device.pool.backend))
        self._events = EventLog(node_id, geometry.block_size, event_retention, clock)
        self._stored_total = self._evicted_total = self._committed_total = 0
        self._demoted_total = self._promoted_total = self._dropped_total = 0
        self._last = self._host or self._device  # the tier a block leaves the node from
        self._retention = Retention(int(retain_max_share * self._last.pool.num_pages))
        self._evicted_now: list[BlockHash] = []  # this call's victims, while anything is retained
        # Deadlines of the pins pin() gave, a min-heap per block (inf: no lease);
        # a block's heap is as long as its client pins, which unpin and maintenance end.
        self._pin_leases: dict[BlockHash, list[float]] = {}
        self._open_disk(disk)

    def _make_tier(self, tier: Tier, pages: int, backend: Backend | None, prefix: str) -> StoreTier:
        pool = PagePool(self.geometry, pages, backend)
        book = ReservationBook(pool, self.clock, lambda r, lease: self._publish(tier, r, lease), prefix=prefix)
        return StoreTier(tier, pool, BlockIndex(), book)

    @property
    def bytes_per_block(self) -> int:
        return self.geometry.bytes_per_block

    @property
    def has_host_tier(self) -> bool:
        return self._host is not None

    # ---- queries ------------------------------------------------------
    def lookup(self, hashes: Sequence[int]) -> LookupResult:
        """Which hashes are resident in either tier. The hits of the longest
        resident prefix count as uses (LRU, lease): a block past the first
        miss serves no prefill, so it is not used."""
        wanted = validate.hash_list(hashes, "lookup", self.max_hashes)
        with self._lock:
            present = [self._holds(h) or self._on_disk(h) for h in wanted]
            prefix = 0
            for hit in present:
                if not hit:
                    break
                prefix += 1
            self._touch(wanted[:prefix])
            return LookupResult(present, prefix)

    def tier_of(self, block_hash: int) -> Tier | None:
        """The tier a read of block_hash uses (the highest that holds it); None: not resident."""
        with self._lock:
            return self._read_tier(block_hash)

    def get_blocks(self, hashes: Sequence[int]) -> Iterator[tuple[BlockHash, np.ndarray]]:
        """Validates and pins every hash now (NotFound names the missing ones),
        then yields (hash, canonical bytes) in request order. The yielded array
        is reused: it is valid until the next item is requested. Pins are
        dropped when the generator ends or is closed."""
        wanted = validate.hash_list(hashes, "get_blocks", self.max_hashes)
        self._stage_from_disk(wanted)
        with self._lock:
            self._require_resident(wanted, "get_blocks")
            pinned = self._pin_all(wanted)
            self._touch(wanted)
        return self._read_pinned(wanted, pinned)

    def _read_pinned(self, wanted: list[BlockHash],
                     pinned: list[tuple[StoreTier, BlockHash]]) -> Iterator[tuple[BlockHash, np.ndarray]]:
        buffer = np.empty(self.bytes_per_block, dtype=np.uint8)
        try:
            for h in wanted:
                self.pack([h], buffer)
                yield h, buffer
        finally:
            with self._lock:
                self._unpin_all(pinned)

    def pack(self, hashes: Sequence[BlockHash], out: Buffer) -> None:
        """Canonical bytes of resident blocks into out, from whichever tier
        holds each (the device tier when both do), without counting as a use
        (replication reads). The caller keeps them pinned."""
        with self._lock:
            self._require_resident(hashes, "pack")
            runs = self._tier_runs(hashes)
            if len(runs) == 1:
                tier, pages = runs[0]
                tier.pool.pack(pages, out)
                return
            flat, bpb, at = bytes_view(out), self.bytes_per_block, 0
            for tier, pages in runs:
                tier.pool.pack(pages, flat[at * bpb:(at + len(pages)) * bpb])
                at += len(pages)

    def stats(self) -> StoreStats:
        with self._lock:
            self._retention.purge(self.clock.now())  # retained_blocks counts live retains only
            return StoreStats(
                self.node_id, self.geometry, self._tier_stats(self._device), self._events.last_sequence,
                len(self._device.book) + (len(self._host.book) if self._host else 0), self._stored_total,
                self._evicted_total, self._committed_total,
                self._tier_stats(self._host) if self._host else None, self._demoted_total, self._promoted_total,
                self._dropped_total, len(self._retention), self._retention.max_blocks, *self._disk_stats())

    @staticmethod
    def _tier_stats(tier: StoreTier) -> TierStats:
        pool, index = tier.pool, tier.index
        return TierStats(pool.num_pages, pool.num_pages - pool.free_count, pool.free_count, index.pinned_count,
                         tier.book.reserved_pages, index.replica_count, index.evictable_count, pool.nbytes)

    def subscribe(self, after_sequence: int, keep_going: Callable[[], bool] = lambda: True,
                  poll_s: float = 0.5) -> Iterator[KVEvent]:
        if after_sequence < 0:
            raise InvalidArgument(f"after_sequence={after_sequence}: must be >= 0")
        return self._events.subscribe(after_sequence, self._snapshot, keep_going, poll_s)

    def _snapshot(self) -> tuple[list[BlockHash], int, list[BlockHash], list[BlockHash]]:
        with self._lock:
            host = self._host.index.hashes() if self._host else []
            disk = self._disk.index.hashes() if self._disk else []
            return self._device.index.hashes(), self._events.last_sequence, host, disk

    # ---- writes -------------------------------------------------------
    def put_blocks(self, blocks: Sequence[BlockWrite]) -> PutResult:
        """Stores the blocks the device tier lacks (a host-only one gets its
        device copy from the bytes given); resident ones count as uses."""
        hashes = validate.hash_list([b.block_hash for b in blocks], "put_blocks",
                                    min(self.max_hashes, self._pool.num_pages), unique=True)
        for i, block in enumerate(blocks):
            size = block.data.nbytes if hasattr(block.data, "nbytes") else len(block.data)  # type: ignore[union-attr]
            if size != self.bytes_per_block:
                raise InvalidArgument(
                    f"put_blocks: block {i} (hash {block.block_hash}) has {size} bytes, "
                    f"expected bytes_per_block={self.bytes_per_block}")
        with self._lock:
            fresh = [b for b in blocks if b.block_hash not in self._index]
            present = [h for h in hashes if h in self._index]
            pages, evicted = self._allocate(len(fresh), protect=present, what="put_blocks")
            for block, page in zip(fresh, pages):
                self._pool.unpack(block.data, [page])
                self._pool.seal([page])  # segment checksums now, while the bytes are hot
                self._index.insert(BlockEntry(block.block_hash, page, block.family, block.parent))
            self._touch(hashes)  # the fresh ones too: the head ends most recent
            self._stored_total += len(fresh)
            self._emit_runs(EventType.STORED, Tier.DEVICE, fresh)
            self._settle_retention()
            return PutResult(len(fresh), len(present), evicted)

    def promote(self, hashes: Sequence[int]) -> int:
        """Copies the blocks of hashes that only the host tier holds into the
        device tier, in one staged copy, before a prefill reads them; every
        hash must be resident (NotFound names the rest). The chain counts as
        a use. Returns how many blocks were copied (0 without a host tier)."""
        wanted = validate.hash_list(hashes, "promote", self.max_hashes)
        self._stage_from_disk(wanted)
        with self._lock:
            self._require_resident(wanted, "promote")
            host = self._host
            up = list(dict.fromkeys(h for h in wanted if h not in self._index))
            if host is None or not up:
                self._touch(wanted)
                return 0
            protect = [h for h in dict.fromkeys(wanted) if h in self._index]
            for h in up:
                host.index.pin(h)  # the device evictions below demote into the host tier: keep these
            try:
                pages, _ = self._allocate(len(up), protect=protect, what="promote")
            finally:
                for h in reversed(up):  # tail first: the pins leave the chain in LRU order (index.py)
                    host.index.unpin(h)
            sources = [host.index.get(h) for h in up]
            self._mover.move(host.pool, [e.page for e in sources], self._pool, pages)  # type: ignore[union-attr]
            for entry, page in zip(sources, pages):
                assert entry is not None
                self._index.insert(BlockEntry(entry.block_hash, page, entry.family, entry.parent))
            self._touch(wanted)
            self._promoted_total += len(up)
            self._emit_runs(EventType.STORED, Tier.DEVICE, sources)  # type: ignore[arg-type]
            self._settle_retention()
            return len(up)

    def retain(self, hashes: Sequence[int], ttl_s: float) -> int:
        """Keeps the prefix of hashes this node holds (either tier) from
        leaving it for ttl_s seconds (services/common/retention.py: passed
        over by the last tier's eviction, at most retain_max_share of its
        pages at once). Nothing is copied and nothing counts as a use.
        Returns how many blocks are retained until then."""
        wanted = validate.hash_list(hashes, "retain", self.max_hashes)
        if not math.isfinite(ttl_s) or ttl_s <= 0:
            raise InvalidArgument(f"retain: ttl_s={ttl_s} must be a positive number of seconds")
        with self._lock:
            held = 0
            for h in wanted:
                if not self._holds(h):
                    break
                held += 1
            now = self.clock.now()
            return self._retention.retain(wanted[:held], now + ttl_s, now)

    def pin(self, hashes: Sequence[int], lease_s: float | None = None) -> int:
        """Pins each block in every tier that holds it now: neither tier evicts
        it until unpin drops the pin or, with lease_s (seconds), maintenance()
        does once lease_s has passed. Pinning again and unpinning once renews."""
        wanted = validate.hash_list(hashes, "pin", self.max_hashes)
        if lease_s is not None:
            validate.lease(lease_s, "pin lease_s")
        self._stage_from_disk(wanted)
        with self._lock:
            self._require_resident(wanted, "pin")
            self._pin_all(wanted)
            self._touch(wanted)
            deadline = self.clock.now() + lease_s if lease_s is not None else math.inf
            for h in wanted:
                heapq.heappush(self._pin_leases.setdefault(h, []), deadline)
            return len(wanted)

    def unpin(self, hashes: Sequence[int]) -> int:
        """Drops one pin per hash (the one whose lease ends first) from every
        tier where the block is pinned."""
        wanted = validate.hash_list(hashes, "unpin", self.max_hashes)
        with self._lock:
            self._require_resident(wanted, "unpin")
            asked: dict[BlockHash, int] = {}
            for h in wanted:
                asked[h] = asked.get(h, 0) + 1
            short = [h for h, n in asked.items() if len(self._pin_leases.get(h, ())) < n]
            if short:
                raise FailedPrecondition(f"unpin: blocks not pinned (that many times): {validate.quote(short)}")
            for h in reversed(wanted):  # back into the LRU tail first (index.py)
                self._drop_pin(h)
            return len(wanted)

    # ---- housekeeping ---------------------------------------------------
    def maintenance(self) -> int:
        """Reaps lapsed reservations (freeing their pages) and ends pins whose
        lease has passed; returns how many reservations it reaped."""
        with self._lock:
            self._expire_pins()
            return self._reap()

    def close(self) -> None:
        """Ends every event subscription; writes what the disk writer holds."""
        self._events.close()
        self._close_disk()

    # ---- internals (lock held) ------------------------------------------
    def _tiers(self) -> tuple[StoreTier, ...]:
        return (self._device,) if self._host is None else (self._device, self._host)

    def _tier(self, tier: Tier, what: str) -> StoreTier:
        if tier is Tier.DEVICE:
            return self._device
        if tier is Tier.DISK:
            raise InvalidArgument(f"{what}: blocks reach the disk tier (STORAGE) only by eviction from the host "
                                  f"tier; reserve in GPU or CPU")
        if self._host is None:
            raise FailedPrecondition(f"{what}: node {self.node_id} has no host tier (started with host_pages 0)")
        return self._host

    def _book_of(self, handle: str) -> StoreTier:
        """The tier whose book issued handle (host handles carry the host book's prefix)."""
        if self._host is not None and handle.startswith(f"{self.node_id}-host-"):
            return self._host
        return self._device

    def _reap(self) -> int:
        return sum(tier.book.reap() for tier in self._tiers())

    def _holds(self, block_hash: int) -> bool:
        return block_hash in self._index or (self._host is not None and block_hash in self._host.index)

    def _read_tier(self, block_hash: int) -> Tier | None:
        if block_hash in self._index:
            return Tier.DEVICE
        if self._host is not None and block_hash in self._host.index:
            return Tier.HOST
        return Tier.DISK if self._on_disk(block_hash) else None

    def _tier_runs(self, hashes: Sequence[BlockHash]) -> list[tuple[StoreTier, list[PageId]]]:
        """hashes (all resident) as runs of consecutive blocks read from one tier."""
        runs: list[tuple[StoreTier, list[PageId]]] = []
        for h in hashes:
            tier = self._device if h in self._index else self._host
            assert tier is not None
            if not runs or runs[-1][0] is not tier:
                runs.append((tier, []))
            runs[-1][1].append(tier.index.get(h).page)  # type: ignore[union-attr]
        return runs

    def _touch(self, hashes: Sequence[BlockHash]) -> None:
        """A use of a chain (head first) in every tier holding its blocks: tail first (index.py)."""
        self._index.touch_chain([h for h in hashes if h in self._index])
        if self._host is not None:
            self._host.index.touch_chain([h for h in hashes if h in self._host.index])
        if self._disk is not None:
            self._disk.index.touch_chain([h for h in hashes if h in self._disk.index])

    def _pin_all(self, hashes: Sequence[BlockHash]) -> list[tuple[StoreTier, BlockHash]]:
        """Pins each block in every tier holding it; returns what to unpin."""
        pinned = []
        for h in hashes:
            for tier in self._tiers():
                if h in tier.index:
                    tier.index.pin(h)
                    pinned.append((tier, h))
        return pinned

    def _drop_pin(self, h: BlockHash) -> None:
        """Ends h's client pin that lapses first: the pins left then lapse no
        earlier than if any other had ended, so no holder loses its pin early."""
        leases = self._pin_leases[h]
        heapq.heappop(leases)
        if not leases:
            del self._pin_leases[h]
        for tier in self._tiers():
            entry = tier.index.get(h)
            if entry is not None and entry.pins:
                tier.index.unpin(h)

    def _expire_pins(self) -> None:
        now = self.clock.now()
        lapsed = [h for h, leases in self._pin_leases.items() if leases[0] <= now]
        for h in reversed(lapsed):  # pinned head first, so tails go back into the LRU first (index.py)
            while h in self._pin_leases and self._pin_leases[h][0] <= now:
                self._drop_pin(h)

    def _unpin_all(self, pinned: list[tuple[StoreTier, BlockHash]]) -> None:
        for tier, h in reversed(pinned):  # back into the LRU tail first (index.py)
            tier.index.unpin(h)

    def _require_resident(self, hashes: Sequence[BlockHash], what: str) -> None:
        missing = [h for h in dict.fromkeys(hashes) if not self._holds(h)]
        if missing:
            raise NotFound(f"{what}: unknown block hashes on node {self.node_id}: {validate.quote(missing)}")

    def _emit_runs(self, kind: EventType, tier: Tier, blocks: Sequence[BlockWrite] | Sequence[BlockEntry]) -> None:
        """One event per run of blocks that chain (parent = previous block,
        same family), like vLLM's BlockStored; blocks given head first."""
        run: list[BlockWrite | BlockEntry] = []
        for block in blocks:
            if run and not (block.parent == run[-1].block_hash and block.family == run[-1].family):
                self._append_run(kind, tier, run)
                run = []
            run.append(block)
        if run:
            self._append_run(kind, tier, run)

    def _append_run(self, kind: EventType, tier: Tier, run: list[BlockWrite | BlockEntry]) -> None:
        self._events.append(kind, tuple(b.block_hash for b in run), parent=run[0].parent, family=run[0].family,
                            medium=tier.medium)
