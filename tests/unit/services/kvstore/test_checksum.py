"""crc32c combination and the segment checksums a host pool caches."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.geometry import KVGeometry
from speckv.services.kvstore.checksum import combine, crc32c, fold
from speckv.services.kvstore.pool import PagePool

# Segments of 3 * 2 * 5 * 2 = 60 bytes: ranges at round offsets cut segments.
ODD = KVGeometry(3, 2, 5, "float16", 3, "odd")


@pytest.mark.parametrize("len_a, len_b", [(0, 0), (0, 9), (9, 0), (1, 1), (100, 7), (32768, 32768),
                                          (3, (1 << 20) + 5), (12345, 999)])
def test_combine_equals_the_checksum_of_the_concatenation(len_a, len_b):
    rng = np.random.default_rng(len_a * 7 + len_b)
    a = rng.integers(0, 256, len_a, dtype=np.uint8).tobytes()
    b = rng.integers(0, 256, len_b, dtype=np.uint8).tobytes()
    assert combine(crc32c(a), crc32c(b), len_b) == crc32c(a + b)


@pytest.mark.parametrize("head, parts, length", [(0, 0, 64), (5, 1, 64), (0, 33, 32768), (7, 4, 1), (3, 2, 0)])
def test_fold_equals_combining_each_equal_length_part_in_turn(head, parts, length):
    rng = np.random.default_rng(head + parts + length)
    first = rng.integers(0, 256, head, dtype=np.uint8).tobytes()
    pieces = [rng.integers(0, 256, length, dtype=np.uint8).tobytes() for _ in range(parts)]
    expected = crc32c(first)
    for piece in pieces:
        expected = combine(expected, crc32c(piece), length)
    assert fold(crc32c(first), [crc32c(p) for p in pieces], length) == expected == crc32c(first + b"".join(pieces))


def filled_pool(pages: int = 6) -> PagePool:
    pool = PagePool(ODD, pages)
    rng = np.random.default_rng(3)
    pool.unpack(rng.integers(0, 256, pages * ODD.bytes_per_block, dtype=np.uint8), list(range(pages)))
    return pool


def packed(pool: PagePool, pages: list[int]) -> bytes:
    out = np.zeros(len(pages) * ODD.bytes_per_block, dtype=np.uint8)
    pool.pack(pages, out)
    return out.tobytes()


@pytest.mark.parametrize("offset, length", [(0, 0), (0, 1), (7, 100), (59, 2), (0, 360), (300, 725), (61, 960)])
def test_pieces_and_their_checksum_cover_exactly_the_canonical_range(offset, length):
    pool, pages = filled_pool(), [4, 1, 3]
    expected = packed(pool, pages)[offset:offset + length]
    pieces = pool.pieces(pages, offset, length)
    assert b"".join(bytes(v) for v in pool.views(pieces)) == expected
    assert pool.range_crc(pieces) == crc32c(expected)  # nothing cached yet: computed
    assert pool.range_crc(pieces) == crc32c(expected)  # whole segments now cached


@pytest.mark.parametrize("segments", [(0, 1), (2, 9), (5, 18), (0, 18)])
def test_whole_segment_spans_give_the_same_bytes_and_checksum(segments):
    pool, pages = filled_pool(), [5, 0, 2]
    offset, length = segments[0] * ODD.segment_bytes, (segments[1] - segments[0]) * ODD.segment_bytes
    spans = pool.spans(pages, offset, length)
    assert spans is not None
    expected = packed(pool, pages)[offset:offset + length]
    assert b"".join(bytes(v) for v in pool.span_views(spans)) == expected
    assert pool.spans_crc(spans) == crc32c(expected)
    assert pool.spans(pages, offset + 1, ODD.segment_bytes) is None  # not on a segment boundary


def test_a_rewritten_page_never_reports_its_old_checksum():
    pool = filled_pool()
    pool.seal([2])
    assert pool.crcs.known(2)
    fresh = np.arange(ODD.bytes_per_block, dtype=np.uint32).astype(np.uint8)
    pool.unpack(fresh, [2])
    assert not pool.crcs.known(2)
    spans = pool.spans([2], 0, ODD.bytes_per_block)
    assert pool.spans_crc(spans) == crc32c(fresh.tobytes())
    pool.write_range([2], 5, b"\x01\x02\x03")
    fresh[5:8] = [1, 2, 3]
    assert pool.spans_crc(spans) == crc32c(fresh.tobytes())
    page = pool.alloc(1)[0]
    assert not pool.crcs.known(page)


def test_out_of_range_is_invalid_argument():
    from speckv.services.common.errors import InvalidArgument

    pool = filled_pool()
    with pytest.raises(InvalidArgument):
        pool.pieces([0, 1], 1, 2 * ODD.bytes_per_block)
    with pytest.raises(InvalidArgument):
        pool.spans([0], -60, 60)
