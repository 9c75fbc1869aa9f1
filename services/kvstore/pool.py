"""The paged block pool of one node, on the host (NumPy) or a GPU (CuPy).

One array, layer-major like vLLM:

    data[num_layers][2][num_pages][block_size][num_kv_heads][head_dim]

A page holds one block; its bytes are 2 * num_layers separate contiguous
segments, which is why whole-block I/O goes through the backend's pack/unpack
(speckv.kernels.backend: the NumPy reference or the CUDA kernels) and byte
ranges that cut a block are copied segment by segment. Free pages sit on a
stack: alloc and free are O(1) per page.

Buffers passed in or out may be bytes, bytearray, memoryview, NumPy arrays,
CuPy arrays or PyTorch tensors (CPU or CUDA). Each is seen through DLPack as
bytes where it lies: a buffer in the pool's memory is packed into or unpacked
from directly, with no copy; one in the other memory goes through a staging
buffer in the pool's memory, reused across calls, and one copy across.

A host pool also offers zero-copy access for the TCP data plane
(services/kvstore/segments.py): `pieces` maps a byte range of a page list to
segment ranges of the flat pool, `views` turns them into memoryviews to
recv_into / sendmsg, and `crcs` caches each segment's crc32c. Every write
path here clears the written pages' cached checksums.

Not thread-safe: the store serializes every call. (Bytes may be written
through views outside the store lock only while the store guarantees the
pages stay reserved; see KVStoreCore.begin_write.)
"""
from __future__ import annotations

from typing import Iterator, NewType, Sequence

import numpy as np

from speckv.kernels import arrays
from speckv.kernels.arrays import Array, SupportsDLPack
from speckv.kernels.backend import Backend, NumpyBackend
from speckv.services.common.errors import InvalidArgument, ResourceExhausted
from speckv.services.common.geometry import KVGeometry
from speckv.services.kvstore.segments import Piece, SegmentCrcs, SegmentLayout, Span

PageId = NewType("PageId", int)
Buffer = bytes | bytearray | memoryview | np.ndarray | SupportsDLPack


def as_bytes_array(buffer: Buffer) -> np.ndarray:
    """A flat uint8 view of a host buffer (no copy); InvalidArgument if it is
    not contiguous or lives on a device."""
    try:
        return arrays.host_bytes(buffer)
    except ValueError as error:
        raise InvalidArgument(f"buffer: {error}") from None


def bytes_view(buffer: Buffer) -> Array:
    """A flat uint8 view of buffer where it lies (NumPy or CuPy), no copy."""
    try:
        return arrays.bytes_view(buffer)
    except ValueError as error:
        raise InvalidArgument(f"buffer: {error}") from None


class PagePool:
    """num_pages blocks of one geometry, plus the free-page stack.

    backend decides where the bytes live (default: plain host memory); pass
    speckv.kernels.backend_choice.select_backend(choice) for CuPy or pinned memory.
    """

    def __init__(self, geometry: KVGeometry, num_pages: int, backend: Backend | None = None) -> None:
        if num_pages <= 0:
            raise InvalidArgument(f"num_pages={num_pages}: must be > 0")
        self.geometry = geometry
        self.num_pages = num_pages
        self.backend: Backend = backend if backend is not None else NumpyBackend()
        g = geometry
        shape = (g.num_layers, 2, num_pages, g.block_size, g.num_kv_heads, g.head_dim)
        self.data = self.backend.zeros(shape, g.storage_dtype)
        # Same memory seen as bytes: last axis becomes head_dim * itemsize.
        self._bytes = self.data.view(np.uint8)
        self._staging: Array | None = None  # for buffers in the other memory
        # Highest page on top so pages are handed out 0, 1, 2, ... at first.
        self._free: list[PageId] = [PageId(p) for p in range(num_pages - 1, -1, -1)]
        self._is_free = np.ones(num_pages, dtype=bool)
        self.layout = SegmentLayout(2 * g.num_layers, num_pages, g.segment_bytes)
        self.crcs = SegmentCrcs(self.layout)
        # Flat byte views of host memory for the zero-copy data plane (None on a device).
        self._flat: np.ndarray | None = None if self.on_device else self._bytes.reshape(-1)
        self._flat_mv: memoryview | None = None if self._flat is None else memoryview(self._flat)

    @property
    def bytes_per_block(self) -> int:
        return self.geometry.bytes_per_block

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def on_device(self) -> bool:
        return self.backend.on_device

    def host_buffer(self, nbytes: int) -> np.ndarray:
        """A uint8 host buffer for staging transfers into or out of this pool:
        page-locked where CuPy and a device are present, so copies to the GPU
        run at full speed (receive chunks into it, then unpack from it)."""
        return self.backend.host_empty(nbytes)

    @property
    def free_count(self) -> int:
        return len(self._free)

    def alloc(self, count: int) -> list[PageId]:
        """count pages off the free stack; ResourceExhausted if fewer are free."""
        if count > len(self._free):
            raise ResourceExhausted(f"need {count} free pages, have {len(self._free)}")
        pages = [self._free.pop() for _ in range(count)]
        self._is_free[pages] = False
        self.crcs.invalidate(pages)
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
        target = bytes_view(out)
        size = self._check_room(target, len(pages))
        if self.backend.holds(target):
            self.backend.pack(self.data, pages, target)
            return
        staging = self._staging_for(size)
        self.backend.pack(self.data, pages, staging)
        arrays.copy_bytes(staging, target[:size])

    def unpack(self, data: Buffer, pages: Sequence[PageId]) -> None:
        """Canonical bytes (len(pages) blocks, list order) into pages."""
        source = bytes_view(data)
        size = self._check_room(source, len(pages))
        self.crcs.invalidate(pages)
        if not self.backend.holds(source):
            staging = self._staging_for(size)
            arrays.copy_bytes(source[:size], staging)
            source = staging
        self.backend.unpack(source, self.data, pages)

    def _check_room(self, buffer: Array, count: int) -> int:
        """Bytes count blocks need; InvalidArgument if buffer is smaller."""
        size = count * self.bytes_per_block
        if buffer.size < size:
            raise InvalidArgument(
                f"buffer of {buffer.size} bytes is too small for {count} blocks of {self.bytes_per_block}")
        return size

    def _staging_for(self, size: int) -> Array:
        """size bytes of reusable staging in the pool's memory."""
        if self._staging is None or self._staging.size < size:
            self._staging = self.backend.empty((size,), np.dtype(np.uint8))
        return self._staging[:size]

    # ---- zero-copy segment access (host pools) -------------------------
    @property
    def zero_copy(self) -> bool:
        """Whether pieces/views/seal work: the pool is in host memory."""
        return self._flat is not None

    def pieces(self, pages: Sequence[PageId], offset: int, length: int) -> list[Piece]:
        """Segment ranges holding canonical bytes [offset, offset+length) of
        pages' blocks; InvalidArgument if outside len(pages) blocks."""
        if offset < 0 or length < 0 or offset + length > len(pages) * self.bytes_per_block:
            raise InvalidArgument(
                f"byte range {offset}+{length} outside {len(pages)} blocks of {self.bytes_per_block}")
        return self.layout.pieces(pages, offset, length)

    def spans(self, pages: Sequence[PageId], offset: int, length: int) -> list[Span] | None:
        """Like pieces, as whole-segment spans; None if the range does not
        start and end on segment boundaries (then use pieces)."""
        if offset < 0 or length < 0 or offset + length > len(pages) * self.bytes_per_block:
            raise InvalidArgument(
                f"byte range {offset}+{length} outside {len(pages)} blocks of {self.bytes_per_block}")
        return self.layout.spans(pages, offset, length)

    def views(self, pieces: Sequence[Piece]) -> list[memoryview]:
        """Writable memoryviews of the pool for pieces (host pools only)."""
        flat = self._require_host()
        return [flat[p.lo:p.hi] for p in pieces]

    def span_views(self, spans: Sequence[Span]) -> list[memoryview]:
        """Writable memoryviews of every segment of spans, in order."""
        flat, seg = self._require_host(), self.layout.segment_bytes
        return [flat[lo:lo + seg] for lo in self.layout.span_starts(spans)]

    def spans_crc(self, spans: Sequence[Span]) -> int:
        self._require_host()
        return self.crcs.spans_crc(self._flat, spans)  # type: ignore[arg-type]

    def range_crc(self, pieces: Sequence[Piece]) -> int:
        """crc32c of the pieces' bytes, from cached segment checksums where
        known (see segments.py)."""
        self._require_host()
        return self.crcs.range_crc(self._flat, pieces)  # type: ignore[arg-type]

    def pages_crcs(self, pages: Sequence[PageId]) -> np.ndarray:
        """[len(pages), 2 * num_layers] segment checksums (host pools)."""
        self._require_host()
        return self.crcs.pages_crcs(self._flat, pages)  # type: ignore[arg-type]

    def seal(self, pages: Sequence[PageId]) -> None:
        """Caches the segment checksums of pages just written (host only; a
        device pool keeps none and is checksummed through staging)."""
        if self._flat is not None:
            self.crcs.seal(self._flat, pages)

    def _require_host(self) -> memoryview:
        if self._flat_mv is None:
            raise InvalidArgument("zero-copy segment access needs a host pool")
        return self._flat_mv

    # ---- byte ranges over a list of pages -----------------------------
    def write_range(self, pages: Sequence[PageId], offset: int, data: Buffer) -> None:
        """Writes data at byte offset of the concatenated canonical blocks of
        pages. The caller checks the range lies inside len(pages) blocks."""
        src = bytes_view(data)
        local = self.backend.holds(src)  # plain slice assignment, no transfer
        self.crcs.invalidate(pages)
        for lo, hi, run, start, stop in self._pieces(pages, offset, src.size):
            if stop - start == self.bytes_per_block:
                self.unpack(src[lo:hi], run)
                continue
            for seg, s_lo, s_hi in self._segments(run[0], start, stop):
                piece = src[lo + s_lo - start: lo + s_hi - start]
                if local:
                    seg[: s_hi - s_lo] = piece
                else:
                    arrays.copy_bytes(piece, seg[: s_hi - s_lo])

    def read_range(self, pages: Sequence[PageId], offset: int, out: Buffer) -> None:
        """Fills out with the bytes at offset of the concatenated blocks."""
        dst = bytes_view(out)
        local = self.backend.holds(dst)
        for lo, hi, run, start, stop in self._pieces(pages, offset, dst.size):
            if stop - start == self.bytes_per_block:
                self.pack(run, dst[lo:hi])
                continue
            for seg, s_lo, s_hi in self._segments(run[0], start, stop):
                piece = dst[lo + s_lo - start: lo + s_hi - start]
                if local:
                    piece[:] = seg[: s_hi - s_lo]
                else:
                    arrays.copy_bytes(seg[: s_hi - s_lo], piece)

    def _pieces(self, pages: Sequence[PageId], offset: int,
                length: int) -> Iterator[tuple[int, int, list[PageId], int, int]]:
        """(buffer lo, hi, pages, start, stop within block): consecutive whole
        blocks merged into one run (one pack/unpack, so one kernel launch on a
        GPU), a cut block alone with its [start, stop)."""
        bpb = self.bytes_per_block
        run: list[PageId] = []
        run_lo = run_hi = 0
        for lo, hi, block, start, stop in self._spans(len(pages), offset, length):
            if stop - start == bpb:
                run_lo = run_lo if run else lo
                run.append(pages[block])
                run_hi = hi
                continue
            if run:
                yield run_lo, run_hi, run, 0, bpb
                run = []
            yield lo, hi, [pages[block]], start, stop
        if run:
            yield run_lo, run_hi, run, 0, bpb

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

    def _segments(self, page: PageId, start: int, stop: int) -> Iterator[tuple[Array, int, int]]:
        """Segments of page overlapping block bytes [start, stop): yields a
        byte view beginning at max(start, segment start) and that overlap."""
        seg_bytes = self.geometry.segment_bytes
        for index in range(start // seg_bytes, (stop - 1) // seg_bytes + 1):
            layer, kv = divmod(index, 2)
            base = index * seg_bytes
            s_lo, s_hi = max(start, base), min(stop, base + seg_bytes)
            segment = self._bytes[layer, kv, page].reshape(-1)
            yield segment[s_lo - base:], s_lo, s_hi
