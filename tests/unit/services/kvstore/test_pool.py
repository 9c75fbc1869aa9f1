from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.errors import InvalidArgument, ResourceExhausted
from speckv.services.common.geometry import KVGeometry, preset
from speckv.services.kvstore.pool import PagePool

ODD = KVGeometry(3, 1, 5, "float32", 3)  # segments of 60 bytes, blocks of 360


def random_blocks(geometry, count, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=count * geometry.bytes_per_block, dtype=np.uint8)


def test_alloc_free_is_a_stack_and_counts():
    pool = PagePool(preset("tiny"), 4)
    assert pool.alloc(2) == [0, 1]
    assert pool.free_count == 2
    pool.free([0])
    assert pool.alloc(1) == [0]
    with pytest.raises(ResourceExhausted):
        pool.alloc(3)
    with pytest.raises(ValueError, match="twice"):
        pool.free([2, 2])


def test_layout_is_layer_major():
    geometry = preset("tiny")
    pool = PagePool(geometry, 3)
    assert pool.data.shape == (2, 2, 3, 4, 2, 8)
    assert pool.nbytes == 3 * geometry.bytes_per_block


@pytest.mark.parametrize("geometry", [preset("tiny"), ODD])
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, np.asarray])
def test_whole_block_round_trip_any_buffer(geometry, kind):
    pool = PagePool(geometry, 4)
    data = random_blocks(geometry, 2)
    pool.unpack(kind(data.tobytes()) if kind is not np.asarray else data, [3, 1])
    out = bytearray(2 * geometry.bytes_per_block)
    pool.pack([3, 1], out)
    assert bytes(out) == data.tobytes()


def test_canonical_order_is_layer_kv_token_head_dim():
    geometry = preset("tiny")
    pool = PagePool(geometry, 2)
    pool.data[1, 0, 1] = 1  # layer 1, K, page 1
    out = np.empty(geometry.bytes_per_block, dtype=np.uint8)
    pool.pack([1], out)
    blocks = out.view(np.float16).reshape(geometry.block_shape)
    assert np.all(blocks[1, 0] == 1) and np.count_nonzero(blocks) == blocks[1, 0].size


@pytest.mark.parametrize("geometry", [preset("tiny"), ODD])
def test_ranges_at_any_offset_rebuild_the_blocks(geometry):
    pages = [2, 0, 3]
    data = random_blocks(geometry, len(pages), seed=4)
    total = data.size
    cuts = sorted({0, 1, 7, geometry.segment_bytes - 1, geometry.bytes_per_block + 3, total - 1, total})
    pool = PagePool(geometry, 4)
    pieces = list(zip(cuts, cuts[1:]))
    for lo, hi in reversed(pieces):  # any order
        pool.write_range(pages, lo, memoryview(data.tobytes())[lo:hi])
    out = np.empty(total, dtype=np.uint8)
    pool.pack(pages, out)
    assert np.array_equal(out, data)
    for lo, hi in pieces:
        part = bytearray(hi - lo)
        pool.read_range(pages, lo, part)
        assert bytes(part) == data[lo:hi].tobytes()


def test_range_outside_the_pages_is_refused():
    geometry = preset("tiny")
    pool = PagePool(geometry, 2)
    with pytest.raises(InvalidArgument, match="outside"):
        pool.write_range([0], geometry.bytes_per_block - 1, b"ab")
    with pytest.raises(InvalidArgument, match="too small"):
        pool.pack([0, 1], bytearray(10))
