"""NIXL descriptors for copying pages between two layer-major pools.

A pool [num_layers][2][num_pages][...] is contiguous, so the segment of
(layer, kv, page) starts at address + ((2 * layer + kv) * num_pages + page)
* segment_bytes, and a run of consecutive pages is one contiguous range per
(layer, K/V). A copy of source pages into target pages is therefore one
descriptor pair per (layer, K/V) and run of pages consecutive on both sides
(shm/runs.py), the same cut as the shared-memory copy.

Batches: the descriptors are cut into batches of at most batch_pages pages
(0: one batch), one NIXL transfer each, so a link cap can pace them and the
target can check each batch as it lands; a run longer than a batch is
split. A batch holds the pairs at positions [first, first + pages) of the
lists given (runs come in list order), so it is bytes [first *
bytes_per_block, (first + pages) * bytes_per_block) of the reservation. Descriptor rows are (address, length, device
id 0), uint64, as NIXL's get_xfer_descs takes an Nx3 array. Pure: no NIXL here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speckv.services.common.errors import FailedPrecondition
from speckv.services.kvstore.shm.runs import paired_runs


@dataclass(frozen=True, slots=True)
class PoolRegion:
    """A layer-major pool at address (bytes, in its owner's address space)."""

    address: int
    num_pages: int
    num_layers: int
    segment_bytes: int

    @property
    def size(self) -> int:
        return 2 * self.num_layers * self.num_pages * self.segment_bytes

    def segment_address(self, layer: int, kv: int, page: int) -> int:
        return self.address + ((2 * layer + kv) * self.num_pages + page) * self.segment_bytes

    def check_pages(self, pages: Sequence[int], whose: str) -> None:
        """FailedPrecondition when a page is outside the pool."""
        bad = [p for p in pages if not 0 <= p < self.num_pages]
        if bad:
            raise FailedPrecondition(f"{whose} pages {bad[:5]} outside its pool of {self.num_pages} pages")


@dataclass(frozen=True, slots=True)
class Batch:
    """One NIXL transfer: local rows are written to remote rows, pairwise."""

    local: np.ndarray  # [n, 3] uint64: address, length, 0
    remote: np.ndarray
    pages: int
    first: int = 0  # position of its first page pair in the lists given

    @property
    def nbytes(self) -> int:
        return int(self.local[:, 1].sum())


def write_batches(source: PoolRegion, target: PoolRegion, source_pages: Sequence[int],
                  target_pages: Sequence[int], batch_pages: int = 0) -> list[Batch]:
    """Descriptor pairs copying source_pages[i] into target_pages[i], in
    batches; FailedPrecondition on a page outside its pool or pools of
    another segment layout (different geometry)."""
    if (source.num_layers, source.segment_bytes) != (target.num_layers, target.segment_bytes):
        raise FailedPrecondition(f"pools of {source.num_layers} layers x {source.segment_bytes} bytes and "
                                 f"{target.num_layers} x {target.segment_bytes}: different KV geometry")
    source.check_pages(source_pages, "source")
    target.check_pages(target_pages, "target")
    batches: list[Batch] = []
    pending: list[tuple[int, int, int]] = []  # (source page, target page, count) in the batch being filled
    room = batch_pages or len(source_pages)
    first = 0
    for run in paired_runs(source_pages, target_pages):
        src, dst, left = run.src, run.dst, run.count
        while left:
            take = min(left, room - sum(c for _, _, c in pending))
            pending.append((src, dst, take))
            src, dst, left = src + take, dst + take, left - take
            if sum(c for _, _, c in pending) == room:
                batches.append(_batch(source, target, pending, first))
                first += room
                pending = []
    if pending:
        batches.append(_batch(source, target, pending, first))
    return batches


def _batch(source: PoolRegion, target: PoolRegion, runs: list[tuple[int, int, int]], first: int) -> Batch:
    rows = 2 * source.num_layers * len(runs)
    local = np.zeros((rows, 3), dtype=np.uint64)
    remote = np.zeros((rows, 3), dtype=np.uint64)
    i = 0
    for src, dst, count in runs:
        for layer in range(source.num_layers):
            for kv in range(2):
                length = count * source.segment_bytes
                local[i, 0], local[i, 1] = source.segment_address(layer, kv, src), length
                remote[i, 0], remote[i, 1] = target.segment_address(layer, kv, dst), length
                i += 1
    return Batch(local, remote, sum(c for _, _, c in runs), first)
