"""A host pool's pages seen as segments: the zero-copy views the TCP data
plane sends from and receives into, and the cached crc32c of each segment.

A block is 2 * num_layers segments (one per layer and K/V), each contiguous
in the layer-major pool; its canonical bytes are those segments in (layer,
K/V) order. A byte range of a list of pages therefore maps to a list of
Pieces: byte ranges of the flat pool, each inside one segment, in canonical
order (whole segments, except at the ends of the range).

Checksums: blocks are immutable while resident, so the crc32c of each whole
segment is computed once while its bytes are hot (when a block is stored, or
right after a segment lands from the network) and kept until the page is
written again. The checksum of any byte range is then folded from them with
checksum.combine, so the replication source never re-reads cold pages just
to checksum them (measured: that cold read cost as much as the send). A
segment without a cached checksum is read and checksummed on demand.

Invariant: ok[page, segment] is True only if crc[page, segment] is the
crc32c of that segment's current bytes, and missing[page] counts the False
entries of ok[page]; every write to a page clears its row first (PagePool
does this on alloc, unpack and write_range).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speckv.services.kvstore.checksum import combine, crc32c, fold


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes [lo, hi) of the flat pool, inside segment `segment` of `page`."""

    lo: int
    hi: int
    page: int
    segment: int
    whole: bool  # the piece is the entire segment

    @property
    def size(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True, slots=True)
class Span:
    """Whole segments [first, last) of one page (the fast path: ranges whose
    ends fall on segment boundaries, i.e. every real geometry with chunks of
    256 KiB multiples)."""

    page: int
    first: int
    last: int


class SegmentLayout:
    """Where the segments of each page lie in the flat pool (bytes)."""

    def __init__(self, num_segments: int, num_pages: int, segment_bytes: int) -> None:
        self.num_segments = num_segments
        self.num_pages = num_pages
        self.segment_bytes = segment_bytes
        self.block_bytes = num_segments * segment_bytes

    def spans(self, pages: Sequence[int], offset: int, length: int) -> list[Span] | None:
        """The range as whole-segment spans, one per block touched; None if
        offset or length is not a multiple of the segment size."""
        seg = self.segment_bytes
        if offset % seg or length % seg:
            return None
        per_block = self.num_segments
        first, end = offset // seg, (offset + length) // seg
        out: list[Span] = []
        while first < end:
            block, lo = divmod(first, per_block)
            hi = min(per_block, lo + end - first)
            out.append(Span(pages[block], lo, hi))
            first += hi - lo
        return out

    def span_starts(self, spans: Sequence[Span]) -> list[int]:
        """Where in the flat pool every segment of spans starts, in order."""
        seg, stride = self.segment_bytes, self.num_pages * self.segment_bytes
        return [b for s in spans for b in range(s.first * stride + s.page * seg, s.last * stride + s.page * seg, stride)]

    def pieces(self, pages: Sequence[int], offset: int, length: int) -> list[Piece]:
        """The pieces of canonical bytes [offset, offset+length) of the
        concatenated blocks of pages, in order. The caller checks the range
        lies inside len(pages) blocks."""
        seg, stride = self.segment_bytes, self.num_pages * self.segment_bytes
        out: list[Piece] = []
        pos, end = offset, offset + length
        while pos < end:
            block, within = divmod(pos, self.block_bytes)
            segment, start = divmod(within, seg)
            stop = min(seg, start + end - pos)
            page = pages[block]
            base = segment * stride + page * seg
            out.append(Piece(base + start, base + stop, page, segment, start == 0 and stop == seg))
            pos += stop - start
        return out


class SegmentCrcs:
    """Cached crc32c per (page, segment) of one pool; see the module doc."""

    def __init__(self, layout: SegmentLayout) -> None:
        self.layout = layout
        self._crc = np.zeros((layout.num_pages, layout.num_segments), dtype=np.uint32)
        self._ok = np.zeros((layout.num_pages, layout.num_segments), dtype=bool)
        # Segments of each page without a cached checksum (a plain list: the
        # source asks once per block per chunk, a NumPy .all() costs ~2 us).
        self._missing = [layout.num_segments] * layout.num_pages

    def invalidate(self, pages: Sequence[int]) -> None:
        for page in pages:
            self._ok[page] = False
            self._missing[page] = self.layout.num_segments

    def record(self, page: int, segment: int, crc: int) -> None:
        self._crc[page, segment] = crc
        if not self._ok[page, segment]:
            self._ok[page, segment] = True
            self._missing[page] -= 1

    def record_pages(self, pages: Sequence[int], crcs: np.ndarray) -> None:
        """crcs[i, segment]: the checksum of every segment of pages[i]."""
        rows = np.asarray(pages, dtype=np.int64)
        self._crc[rows] = crcs
        self._ok[rows] = True
        for page in pages:
            self._missing[page] = 0

    def pages_crcs(self, flat: np.ndarray, pages: Sequence[int]) -> np.ndarray:
        """[len(pages), num_segments] checksums, sealing pages missing any."""
        for page in pages:
            if self._missing[page]:
                self.seal(flat, [page])
        return self._crc[np.asarray(pages, dtype=np.int64)]

    def known(self, page: int) -> bool:
        """Whether every segment of page has its checksum cached."""
        return self._missing[page] == 0

    def seal(self, flat: np.ndarray, pages: Sequence[int]) -> None:
        """Computes and caches every segment checksum of pages (call while
        their bytes are hot, e.g. right after they were written)."""
        for page in pages:
            for piece in self.layout.pieces([page], 0, self.layout.block_bytes):
                self.record(page, piece.segment, crc32c(flat[piece.lo:piece.hi]))

    def record_spans(self, spans: Sequence[Span], crcs: Sequence[int]) -> None:
        """crcs: one per segment of spans, in order."""
        i = 0
        for s in spans:
            n = s.last - s.first
            self._crc[s.page, s.first:s.last] = crcs[i:i + n]
            self._missing[s.page] -= n - int(np.count_nonzero(self._ok[s.page, s.first:s.last]))
            self._ok[s.page, s.first:s.last] = True
            i += n

    def spans_crc(self, flat: np.ndarray, spans: Sequence[Span]) -> int:
        """crc32c of the spans' bytes, folded from cached segment checksums
        (a page missing any is sealed first: one read of it)."""
        crc, seg = 0, self.layout.segment_bytes
        for s in spans:
            if self._missing[s.page]:
                self.seal(flat, [s.page])
            crc = fold(crc, self._crc[s.page, s.first:s.last].tolist(), seg)
        return crc

    def range_crc(self, flat: np.ndarray, pieces: Sequence[Piece]) -> int:
        """crc32c of the concatenated pieces: cached segment checksums where
        known, the bytes otherwise (whole segments computed are cached)."""
        crc = 0
        crcs, ok = self._crc, self._ok
        for p in pieces:
            if p.whole and ok[p.page, p.segment]:
                part = int(crcs[p.page, p.segment])
            else:
                part = crc32c(flat[p.lo:p.hi])
                if p.whole:
                    self.record(p.page, p.segment, part)
            crc = combine(crc, part, p.hi - p.lo)  # combine(0, c, n) == c: crc32c(b'') is 0
        return crc
