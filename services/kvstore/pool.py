"""The paged block pool of one node (NumPy backend).

One array, layer-major like vLLM:

    data[num_layers][2][num_pages][block_size][num_kv_heads][head_dim]

A page holds one block; its bytes are 2 * num_layers separate contiguous
segments, which is why whole-block I/O goes through the pack/unpack kernels
(speckv.kernels.reference) and byte ranges that cut a block are copied segment
by segment. Free pages sit on a stack: alloc and free are O(1) per page.

Not thread-safe: the store serializes every call. Buffers passed in may be
bytes, bytearray, memoryview or NumPy arrays; nothing is copied through an
intermediate `bytes` object.
"""
from __future__ import annotations

from typing import Iterator, NewType, Sequence

import numpy as np

from speckv.kernels import reference
from speckv.services.common.errors import InvalidArgument, ResourceExhausted
from speckv.services.common.geometry import KVGeometry

PageId = NewType("PageId", int)
Buffer = bytes | bytearray | memoryview | np.ndarray


def as_bytes_array(buffer: Buffer) -> np.ndarray:
    """A flat uint8 view of buffer (no copy)."""
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise InvalidArgument("buffer must be C-contiguous")
        return buffer.reshape(-1).view(np.uint8)
    return np.frombuffer(buffer, dtype=np.uint8)


class PagePool:
    """num_pages blocks of one geometry, plus the free-page stack."""

    def __init__(self, geometry: KVGeometry, num_pages: int) -> None:
        if num_pages <= 0:
            raise InvalidArgument(f"num_pages={num_pages}: must be > 0")
        self.geometry = geometry
        self.num_pages = num_pages
        g = geometry
        shape = (g.num_layers, 2, num_pages, g.block_size, g.num_kv_heads, g.head_dim)
        self.data = np.zeros(shape, dtype=g.storage_dtype)
        # Same memory seen as bytes: last axis becomes head_dim * itemsize.
        self._bytes = self.data.view(np.uint8)
        # Highest page on top so pages are handed out 0, 1, 2, ... at first.
        self._free: list[PageId] = [PageId(p) for p in range(num_pages - 1, -1, -1)]
        self._is_free = np.ones(num_pages, dtype=bool)

    @property
    def bytes_per_block(self) -> int:
        return self.geometry.bytes_per_block

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def free_count(self) -> int:
        return len(self._free)

    def alloc(self, count: int) -> list[PageId]:
        """count pages off the free stack; ResourceExhausted if fewer are free."""
        if count > len(self._free):
            raise ResourceExhausted(f"need {count} free pages, have {len(self._free)}")
        pages = [self._free.pop() for _ in range(count)]
        self._is_free[pages] = False
        return pages

    def free(self, pages: Sequence[PageId]) -> None:
        for page in pages:
            if self._is_free[page]:
                raise ValueError(f"page {page} freed twice")  # a bug, not a client error
            self._is_free[page] = True
            self._free.append(page)

    # ---- whole blocks -------------------------------------------------
    def pack(self, pages: Sequence[PageId], out: Buffer) -> None:
        """Canonical bytes of pages, in list order, into the start of out."""
        staging = as_bytes_array(out)
        self._check_room(staging, len(pages))
        reference.pack(self.data, pages, staging.view(self.data.dtype))

    def unpack(self, data: Buffer, pages: Sequence[PageId]) -> None:
        """Canonical bytes (len(pages) blocks, list order) into pages."""
        staging = as_bytes_array(data)
        self._check_room(staging, len(pages))
        usable = staging[: len(pages) * self.bytes_per_block]
        reference.unpack(usable.view(self.data.dtype), self.data, pages)

    def _check_room(self, staging: np.ndarray, count: int) -> None:
        if staging.size < count * self.bytes_per_block:
            raise InvalidArgument(
                f"buffer of {staging.size} bytes is too small for {count} blocks of {self.bytes_per_block}")

    # ---- byte ranges over a list of pages -----------------------------
    def write_range(self, pages: Sequence[PageId], offset: int, data: Buffer) -> None:
        """Writes data at byte offset of the concatenated canonical blocks of
        pages. The caller checks the range lies inside len(pages) blocks."""
        src = as_bytes_array(data)
        for lo, hi, block, start, stop in self._spans(len(pages), offset, src.size):
            if stop - start == self.bytes_per_block:
                self.unpack(src[lo:hi], [pages[block]])
            else:
                for seg, s_lo, s_hi in self._segments(pages[block], start, stop):
                    seg[: s_hi - s_lo] = src[lo + s_lo - start: lo + s_hi - start]

    def read_range(self, pages: Sequence[PageId], offset: int, out: Buffer) -> None:
        """Fills out with the bytes at offset of the concatenated blocks."""
        dst = as_bytes_array(out)
        for lo, hi, block, start, stop in self._spans(len(pages), offset, dst.size):
            if stop - start == self.bytes_per_block:
                self.pack([pages[block]], dst[lo:hi])
            else:
                for seg, s_lo, s_hi in self._segments(pages[block], start, stop):
                    dst[lo + s_lo - start: lo + s_hi - start] = seg[: s_hi - s_lo]

    def _spans(self, count: int, offset: int, length: int) -> Iterator[tuple[int, int, int, int, int]]:
        """(buffer lo, hi, block index, start, stop within block) pieces."""
        bpb = self.bytes_per_block
        if offset < 0 or offset + length > count * bpb:
            raise InvalidArgument(f"byte range {offset}+{length} outside {count} blocks of {bpb}")
        pos = 0
        while pos < length:
            block, start = divmod(offset + pos, bpb)
            stop = min(bpb, start + length - pos)
            yield pos, pos + stop - start, block, start, stop
            pos += stop - start

    def _segments(self, page: PageId, start: int, stop: int) -> Iterator[tuple[np.ndarray, int, int]]:
        """Segments of page overlapping block bytes [start, stop): yields a
        byte view beginning at max(start, segment start) and that overlap."""
        seg_bytes = self.geometry.segment_bytes
        for index in range(start // seg_bytes, (stop - 1) // seg_bytes + 1):
            layer, kv = divmod(index, 2)
            base = index * seg_bytes
            s_lo, s_hi = max(start, base), min(stop, base + seg_bytes)
            segment = self._bytes[layer, kv, page].reshape(-1)
            yield segment[s_lo - base:], s_lo, s_hi
