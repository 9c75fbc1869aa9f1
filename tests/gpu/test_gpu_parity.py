"""CuPy pack/unpack (kv_pack.cu) against the NumPy reference, byte for byte:
0, 1, n-1, n, n+1 blocks, odd and aligned geometries, fp16 / bf16 / fp32, the
16-byte path and the byte path (forced with a misaligned staging buffer).
Needs a CUDA device; skipped without one."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.kernels import reference
from speckv.kernels.backend import NumpyBackend, cuda_available
from tests.support.kernels_cases import (
    GEOMETRIES,
    block_bytes,
    brute_pack,
    geometry_id,
    make_pool,
    page_lists,
    segment_bytes,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a CUDA device")]


@pytest.fixture(scope="module")
def gpu():
    from speckv.kernels.cupy_backend import CupyBackend

    return CupyBackend()


def device_staging(cp, nbytes: int, misalign: int):
    """nbytes of device staging starting misalign bytes past a 256-byte
    aligned allocation, pre-filled with 0xAB (so untouched bytes show)."""
    raw = cp.full(nbytes + misalign + 32, 0xAB, dtype=cp.uint8)
    return raw, raw[misalign: misalign + nbytes + 32]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
@pytest.mark.parametrize("misalign", [0, 1, 8])
def test_pack_matches_reference(gpu, geometry, misalign):
    cp = gpu.xp
    host_pool = make_pool(*geometry)
    pool = cp.asarray(host_pool)
    for pages in page_lists(host_pool.shape[2]):
        size = len(pages) * block_bytes(host_pool)
        raw, staging = device_staging(cp, size, misalign)
        gpu.pack(pool, pages, staging)
        expected = np.empty(size, dtype=np.uint8)
        NumpyBackend().pack(host_pool, pages, expected)
        got = cp.asnumpy(raw)
        assert np.array_equal(got[misalign: misalign + size], expected), (pages, misalign)
        assert np.array_equal(expected, brute_pack(host_pool, pages).reshape(-1).view(np.uint8))
        assert np.all(got[:misalign] == 0xAB) and np.all(got[misalign + size:] == 0xAB)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
@pytest.mark.parametrize("misalign", [0, 1, 8])
def test_unpack_matches_reference(gpu, geometry, misalign):
    cp = gpu.xp
    host_pool = make_pool(*geometry, seed=2)
    for pages in page_lists(host_pool.shape[2], distinct=True):
        size = len(pages) * block_bytes(host_pool)
        payload = make_pool(*geometry, seed=3).reshape(-1).view(np.uint8)[:size].copy()
        raw, staging = device_staging(cp, size, misalign)
        if size:
            staging[:size].set(payload)
        pool = cp.asarray(host_pool)
        gpu.unpack(staging, pool, pages)
        expected = host_pool.copy()
        reference.unpack(payload.view(host_pool.dtype), expected, pages)
        assert np.array_equal(cp.asnumpy(pool).view(np.uint8), expected.view(np.uint8)), (pages, misalign)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
def test_paths_are_chosen_by_alignment(gpu, geometry):
    from speckv.kernels.cupy_backend import use_vector_path

    cp = gpu.xp
    pool = cp.asarray(make_pool(*geometry))
    aligned = cp.empty(block_bytes(pool) + 16, dtype=cp.uint8)
    vectorisable = segment_bytes(geometry) % 16 == 0
    assert use_vector_path(segment_bytes(geometry), pool.data.ptr, aligned.data.ptr) == vectorisable
    assert not use_vector_path(segment_bytes(geometry), pool.data.ptr, aligned[1:].data.ptr)


def test_large_round_trip_grid_strides(gpu):
    """More (block, segment) pairs than the 65535-block grid: every pair is
    still copied."""
    cp = gpu.xp
    layers, pages = 40, 1000  # 80 segments x 1000 blocks = 80,000 pairs
    pool = cp.arange(layers * 2 * pages * 16, dtype=cp.uint32).astype(cp.float32).reshape(layers, 2, pages, 1, 2, 8)
    order = [int(p) for p in np.random.default_rng(5).permutation(pages)]
    staging = cp.empty(pages * block_bytes(pool), dtype=cp.uint8)
    gpu.pack(pool, order, staging)
    rebuilt = cp.zeros_like(pool)
    gpu.unpack(staging, rebuilt, order)
    gpu.synchronize()
    assert bool(cp.array_equal(rebuilt.view(cp.uint8), pool.view(cp.uint8)))


def test_refusals_leave_the_pool_untouched(gpu):
    cp = gpu.xp
    host_pool = make_pool(*GEOMETRIES[0])
    pool = cp.asarray(host_pool)
    staging = cp.zeros(3 * block_bytes(host_pool), dtype=cp.uint8)
    with pytest.raises(ValueError, match="twice"):
        gpu.unpack(staging, pool, [1, 1])
    with pytest.raises(IndexError):
        gpu.unpack(staging, pool, [0, 99])
    with pytest.raises(ValueError, match="blocks need"):
        gpu.unpack(staging, pool, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="not a CuPy array"):
        gpu.pack(pool, [0], np.zeros(block_bytes(host_pool), dtype=np.uint8))
    assert np.array_equal(cp.asnumpy(pool).view(np.uint8), host_pool.view(np.uint8))
