"""The records KVStoreCore (store.py) takes and returns: blocks to put, a
zero-copy write under way, what a put or lookup found, and the two tiers'
page counts (TierStats, StoreStats; the disk tier's slots count as its pages). Plain data, no behaviour beyond the
device tier's figures answering to their pre-tier names."""
from __future__ import annotations

from dataclasses import dataclass, field

from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import BlockHash
from speckv.services.kvstore.segments import Piece, Span
from speckv.services.kvstore.pool import Buffer
from speckv.services.kvstore.reservations import Reservation


@dataclass(slots=True)
class BlockWrite:
    block_hash: BlockHash
    data: Buffer  # canonical bytes, bytes_per_block long
    family: str = ""
    parent: BlockHash | None = None


@dataclass(frozen=True, slots=True)
class ZeroCopyWrite:
    """A chunk being received straight into reserved pages: write `views`
    (in order, `size` bytes in all), then finish_write or cancel_write."""

    reservation: Reservation
    offset: int
    size: int
    spans: list[Span] | None  # whole segments (the common case), or
    pieces: list[Piece]  # segment pieces, when the range cuts segments
    views: list[memoryview]


@dataclass(slots=True)
class PutResult:
    stored: int
    already_present: int
    evicted: int


@dataclass(slots=True)
class LookupResult:
    present: list[bool]
    prefix_blocks: int


@dataclass(slots=True)
class TierStats:
    """One tier's pages (a block in both tiers has a page in each)."""

    num_pages: int
    used_pages: int  # not free: resident + reserved
    free_pages: int
    pinned_pages: int
    reserved_pages: int
    replica_pages: int  # speculative replicas still carrying a lease
    evictable_pages: int  # resident and unpinned
    pool_bytes: int


@dataclass(slots=True)
class StoreStats:
    """Both tiers' pages (host None without one), the event log's position
    and the block counters; the device tier's figures also answer to their
    pre-tier names (num_pages, used_pages, ...)."""

    node_id: str
    geometry: KVGeometry
    device: TierStats
    last_event_sequence: int
    open_reservations: int
    blocks_stored_total: int
    blocks_evicted_total: int  # left the device tier (demoted or dropped)
    blocks_committed_total: int
    host: TierStats | None = None
    blocks_demoted_total: int = 0
    blocks_promoted_total: int = 0
    blocks_dropped_total: int = 0  # left the node: evicted with no copy in the other tier
    retained_blocks: int = 0  # blocks retained now (the retain action)
    retain_max_blocks: int = 0  # the most it retains at once (retain_max_share of its last tier)
    disk: TierStats | None = None  # the disk tier's record slots (pages), None without one
    disk_counters: dict[str, int] = field(default_factory=dict)  # disk/tier.py DiskCounters

    @property
    def num_pages(self) -> int:
        return self.device.num_pages

    @property
    def used_pages(self) -> int:
        return self.device.used_pages

    @property
    def free_pages(self) -> int:
        return self.device.free_pages

    @property
    def pinned_pages(self) -> int:
        return self.device.pinned_pages

    @property
    def reserved_pages(self) -> int:
        return self.device.reserved_pages

    @property
    def replica_pages(self) -> int:
        return self.device.replica_pages

    @property
    def evictable_pages(self) -> int:
        return self.device.evictable_pages

    @property
    def pool_bytes(self) -> int:
        return self.device.pool_bytes

    @property
    def available_pages(self) -> int:
        """Device pages a new request could get: free plus evictable."""
        return self.device.free_pages + self.device.evictable_pages

    @property
    def host_pages(self) -> int:
        return self.host.num_pages if self.host is not None else 0
