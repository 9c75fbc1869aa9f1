"""One memory tier of a node's store: its page pool, its index and its
reservation book (services/common/tiers.py names the tiers).

A node has a device tier and, optionally, a host tier below it. Each tier
evicts by its own index's policy (index.py); a block in both tiers has an
entry in each. Blocks move between tiers only through `move_pages`: one
staged copy of many scattered pages, gathered out of one pool by the
backend's pack kernel into one contiguous buffer and scattered into the other
by its unpack kernel (the NumPy reference on CPU, the CUDA kernels on a GPU),
so demoting or promoting n blocks is one gather and one scatter, not n small
copies. The staging buffer is host memory, pinned when a device is present
(Backend.host_empty), and reused while it is large enough.
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
    """Staged copies between two pools of one geometry (not thread-safe: the store's lock serialises it)."""

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
        nbytes = len(pages) * self._bytes_per_block
        if self._staging is None or self._staging.nbytes < nbytes:
            self._staging = self._backend.host_empty(nbytes)
        staging = self._staging[:nbytes]
        source.pack(list(pages), staging)
        target.unpack(staging, list(into))
        return nbytes
