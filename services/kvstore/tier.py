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
from typing import Any, Sequence

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
    the bytes are read and written once. A device pool and a pinned host
    pool: the device's pack kernel gathers the blocks into device staging
    and its unpack kernel scatters them into the other pool, reading or
    writing the pinned pages directly (_through_mapped): one pass across the
    host link. Otherwise one staged copy through a host buffer: the source
    pool packs into it and the target unpacks from it."""

    def __init__(self, bytes_per_block: int, staging_backend) -> None:
        self._bytes_per_block = bytes_per_block
        self._backend = staging_backend
        self._staging: np.ndarray | None = None
        self._device_staging: Any = None
        self._mapped: dict[int, Any] = {}  # id(host pool) -> its array as the device sees it, or None

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
        if source.on_device != target.on_device and self._through_mapped(source, pages, target, into, nbytes):
            return nbytes
        if self._staging is None or self._staging.nbytes < nbytes:
            self._staging = self._backend.host_empty(nbytes)
        staging = self._staging[:nbytes]
        source.pack(list(pages), staging)
        target.unpack(staging, list(into))
        return nbytes

    def _through_mapped(self, source: PagePool, pages: Sequence[PageId], target: PagePool,
                        into: Sequence[PageId], nbytes: int) -> bool:
        """Device <-> pinned host pool: the device's pack kernel gathers the
        blocks into device staging and its unpack kernel scatters them
        straight into the other pool, the host pool's pinned pages read or
        written by the kernel through unified addressing, so the bytes cross
        the host link once and no CPU copy touches them. False when the host
        pool is not pinned (then the staged path)."""
        device_pool, host_pool = (source, target) if source.on_device else (target, source)
        view = self._mapped_view(host_pool, device_pool.backend)
        if view is None:
            return False
        gpu = device_pool.backend
        if self._device_staging is None or self._device_staging.nbytes < nbytes:
            self._device_staging = gpu.empty((nbytes,), np.dtype(np.uint8))
        staging = self._device_staging[:nbytes]
        source_array = source.data if source.on_device else view
        target_array = target.data if target.on_device else view
        gpu.pack(source_array, list(pages), staging)
        gpu.unpack(staging, target_array, list(into))
        gpu.synchronize()
        target.crcs.invalidate(list(into))
        return True

    def _mapped_view(self, pool: PagePool, gpu: Any) -> Any:
        """pool's pinned host array as a device array (same bytes), or None."""
        if id(pool) in self._mapped:
            return self._mapped[id(pool)]
        view = None
        if getattr(pool.backend, "pinned", False) and getattr(gpu, "on_device", False):
            cp, host = gpu.xp, pool.data
            try:
                memory = cp.cuda.UnownedMemory(host.ctypes.data, host.nbytes, host, gpu.device.id)
                view = cp.ndarray(host.shape, host.dtype, cp.cuda.MemoryPointer(memory, 0))
            except Exception:  # noqa: BLE001 - no unified addressing for this memory: the staged path
                view = None
        self._mapped[id(pool)] = view
        return view
