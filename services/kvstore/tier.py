"""One memory tier of a node's store: its page pool, its index and its
reservation book (services/common/tiers.py names the tiers).

A node has a device tier and, optionally, a host tier below it. Each tier
evicts by its own index's policy (index.py); a block in both tiers has an
entry in each. Blocks move between tiers only through PageMover: on a GPU
one staged copy of many scattered pages, gathered out of the device pool by
the pack kernel into one pinned host buffer and scattered by the unpack
kernel, so demoting or promoting n blocks is one transfer across the host
link, not n small ones; on CPU (both tiers NumPy) one direct copy per block.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speckv.services.common.tiers import Tier
from speckv.services.kvstore.index import BlockIndex
from speckv.services.kvstore.pool import PageId, PagePool
from speckv.services.kvstore.reservations import ReservationBook


@dataclass(slots=True)
class StoreTier:
    tier: Tier
    pool: PagePool
    index: BlockIndex
    book: ReservationBook

    @property
    def medium(self) -> str:
        return self.tier.medium


class PageMover:
    """Copies of blocks between two pools of one geometry (not thread-safe:
    the store's lock serialises it).

    Two host pools (the NumPy tiers on CPU): each block goes straight from
    its source page to its target page, one strided NumPy copy per block, so
    the bytes are read and written once. A pool on a device: one staged copy
    of all the blocks, gathered by the source pool's pack kernel into one
    host buffer (pinned where a device is present, reused while it is large
    enough) and scattered by the target's unpack kernel: one transfer across
    the host link, whatever the number of blocks."""

    def __init__(self, bytes_per_block: int, staging_backend) -> None:
        self._bytes_per_block = bytes_per_block
        self._backend = staging_backend
        self._staging: np.ndarray | None = None

    def move(self, source: PagePool, pages: Sequence[PageId], target: PagePool, into: Sequence[PageId]) -> int:
        """Copies the blocks of pages (in source) into the pages into (in
        target), in order; returns the bytes moved. The written pages' segment
        checksums are computed when first needed, not here (pool.py)."""
        if len(pages) != len(into):
            raise ValueError(f"{len(pages)} source pages for {len(into)} target pages")
        if not pages:
            return 0
        if source.zero_copy and target.zero_copy:
            target.crcs.invalidate(list(into))
            src, dst = source.data, target.data
            for s, d in zip(pages, into):
                dst[:, :, d] = src[:, :, s]
            return len(pages) * self._bytes_per_block
        nbytes = len(pages) * self._bytes_per_block
        if self._staging is None or self._staging.nbytes < nbytes:
            self._staging = self._backend.host_empty(nbytes)
        staging = self._staging[:nbytes]
        source.pack(list(pages), staging)
        target.unpack(staging, list(into))
        return nbytes
