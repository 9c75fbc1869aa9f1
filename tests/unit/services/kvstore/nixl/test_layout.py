"""NIXL descriptors between two layer-major pools: the bytes they name are
exactly the pages' segments, run by run, batched by page count."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.errors import FailedPrecondition
from speckv.services.kvstore.nixl.layout import PoolRegion, write_batches

LAYERS, SEGMENT = 3, 16


def pool(num_pages: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (LAYERS, 2, num_pages, SEGMENT), dtype=np.uint8)


def region(array: np.ndarray) -> PoolRegion:
    return PoolRegion(array.ctypes.data, array.shape[2], LAYERS, SEGMENT)


def apply(batches, source: np.ndarray, target: np.ndarray) -> None:
    """Does what NIXL would: copies each local row's bytes to its remote row."""
    src_flat, dst_flat = source.reshape(-1), target.reshape(-1)
    for batch in batches:
        for (s_addr, s_len, _), (d_addr, d_len, _) in zip(batch.local.tolist(), batch.remote.tolist()):
            assert s_len == d_len
            s, d = s_addr - source.ctypes.data, d_addr - target.ctypes.data
            dst_flat[d:d + d_len] = src_flat[s:s + s_len]


@pytest.mark.parametrize("batch_pages", [0, 1, 2, 3, 100])
@pytest.mark.parametrize("pages", [
    ([0], [5]), ([1, 2, 3], [4, 5, 6]), ([0, 1, 2, 7, 8], [9, 3, 4, 5, 0]), ([6, 5, 4], [0, 1, 2]),
])
def test_batches_copy_exactly_the_pages(pages, batch_pages):
    source, target = pool(10, 1), pool(12, 2)
    before = target.copy()
    src_pages, dst_pages = pages
    batches = write_batches(region(source), region(target), src_pages, dst_pages, batch_pages)
    apply(batches, source, target)
    expected = before.copy()
    expected[:, :, dst_pages] = source[:, :, src_pages]
    assert np.array_equal(target, expected)
    assert sum(b.pages for b in batches) == len(src_pages)
    assert all(b.pages <= (batch_pages or len(src_pages)) for b in batches)
    assert sum(b.nbytes for b in batches) == len(src_pages) * 2 * LAYERS * SEGMENT
    assert [b.first for b in batches] == list(np.cumsum([0] + [b.pages for b in batches[:-1]]))


@pytest.mark.parametrize("batch_pages", [1, 2, 3])
def test_a_batch_is_the_pairs_at_its_positions(batch_pages):
    """Batch k writes exactly pairs [first, first + pages) of the lists, so
    its bytes are that range of the reservation (what its note names)."""
    source, target = pool(10, 1), pool(12, 2)
    src_pages, dst_pages = [0, 1, 2, 7, 8, 3], [9, 3, 4, 5, 0, 11]
    for batch in write_batches(region(source), region(target), src_pages, dst_pages, batch_pages):
        target[...] = 0
        apply([batch], source, target)
        span = slice(batch.first, batch.first + batch.pages)
        assert np.array_equal(target[:, :, dst_pages[span]], source[:, :, src_pages[span]])
        untouched = [p for p in range(12) if p not in dst_pages[span]]
        assert not target[:, :, untouched].any()


def test_a_run_consecutive_on_both_sides_is_one_descriptor_per_layer_and_kv():
    source, target = pool(10, 1), pool(10, 2)
    (batch,) = write_batches(region(source), region(target), [2, 3, 4, 5], [6, 7, 8, 9])
    assert batch.local.shape == (2 * LAYERS, 3) and set(batch.local[:, 1].tolist()) == {4 * SEGMENT}


def test_pages_outside_a_pool_or_another_geometry_are_refused():
    source, target = pool(4, 1), pool(4, 2)
    with pytest.raises(FailedPrecondition, match="target pages"):
        write_batches(region(source), region(target), [0], [4])
    with pytest.raises(FailedPrecondition, match="source pages"):
        write_batches(region(source), region(target), [-1], [0])
    other = PoolRegion(target.ctypes.data, 4, LAYERS + 1, SEGMENT)
    with pytest.raises(FailedPrecondition, match="geometry"):
        write_batches(region(source), other, [0], [0])
