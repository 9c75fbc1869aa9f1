"""The backend interface on the host: NumpyBackend against brute force,
byte-level staging, page checks, backend selection and the CuPy backend's
pure launch arithmetic (importable without a GPU)."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.kernels import cupy_backend
from speckv.kernels.backend import NumpyBackend, check_pages, pool_geometry
from tests.support.kernels_cases import (
    GEOMETRIES,
    block_bytes,
    brute_pack,
    brute_unpack,
    geometry_id,
    make_pool,
    page_lists,
)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
@pytest.mark.parametrize("misalign", [0, 1])
def test_pack_matches_brute_force_into_byte_staging(geometry, misalign):
    backend = NumpyBackend()
    pool = make_pool(*geometry)
    for pages in page_lists(pool.shape[2]):
        size = len(pages) * block_bytes(pool)
        # uint8 staging, optionally starting at an odd address, with a tail.
        raw = np.full(size + misalign + 5, 0xAB, dtype=np.uint8)
        staging = raw[misalign:]
        backend.pack(pool, pages, staging)
        assert np.array_equal(staging[:size], brute_pack(pool, pages).reshape(-1).view(np.uint8))
        assert np.all(staging[size:] == 0xAB) and np.all(raw[:misalign] == 0xAB)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
def test_unpack_matches_brute_force(geometry):
    backend = NumpyBackend()
    pool = make_pool(*geometry, seed=2)
    for pages in page_lists(pool.shape[2], distinct=True):
        staging = make_pool(*geometry, seed=3).reshape(-1).view(np.uint8)[: len(pages) * block_bytes(pool)].copy()
        target = pool.copy()
        backend.unpack(staging, target, pages)
        expected = brute_unpack(staging.view(pool.dtype), pool, pages)
        assert np.array_equal(target.view(np.uint8), expected.view(np.uint8))


def test_pool_geometry_and_page_checks():
    pool = make_pool(*GEOMETRIES[1])
    assert pool_geometry(pool) == (6, 7, 60)
    assert list(check_pages([3, 0], 7, distinct=True)) == [3, 0]
    with pytest.raises(IndexError, match="page 7"):
        check_pages([0, 7], 7, distinct=False)
    with pytest.raises(IndexError, match="page -1"):
        check_pages([-1], 7, distinct=False)
    with pytest.raises(ValueError, match="twice"):
        check_pages([2, 2], 7, distinct=True)
    with pytest.raises(ValueError, match="pool must be"):
        pool_geometry(pool[0])


def test_unpack_refuses_repeated_pages_and_short_staging():
    backend = NumpyBackend()
    pool = make_pool(*GEOMETRIES[0])
    staging = np.zeros(2 * block_bytes(pool), dtype=np.uint8)
    before = pool.copy()
    with pytest.raises(ValueError, match="twice"):
        backend.unpack(staging, pool, [1, 1])
    with pytest.raises(ValueError, match="3 blocks need"):
        backend.unpack(staging, pool, [0, 1, 2])
    with pytest.raises(ValueError, match="contiguous"):
        backend.pack(pool, [0], np.zeros(4 * block_bytes(pool), dtype=np.uint8)[::2])
    assert np.array_equal(pool.view(np.uint8), before.view(np.uint8))


def test_device_copy_and_dlpack_on_the_host():
    backend = NumpyBackend()
    src = np.arange(12, dtype=np.float32)
    dst = np.zeros(12, dtype=np.float32)
    backend.device_copy(src, dst)
    assert np.array_equal(src, dst)
    view = backend.from_dlpack(dst)
    assert view.dtype == np.uint8 and view.ctypes.data == dst.ctypes.data
    backend.synchronize()


def test_empty_and_zeros_and_host_buffers():
    backend = NumpyBackend()
    assert backend.zeros((2, 3), np.float16).dtype == np.float16
    assert not backend.zeros((4,), np.uint8).any()
    buffer = backend.host_empty(100)
    assert buffer.dtype == np.uint8 and buffer.size == 100
    assert backend.holds(buffer) and not backend.holds(b"abc")


@pytest.mark.parametrize("pairs, segment, vector, expected", [
    (10, 64, True, (10, 32)),          # 4 words: one warp, not 256 threads
    (10, 32 * 1024, True, (10, 256)),  # llama-3-8b segment: 2048 words, capped
    (10, 30, False, (10, 32)),         # byte path, 30 bytes
    (10, 1000, False, (10, 256)),
    (10**6, 128, True, (65535, 32)),   # grid capped, the kernel grid-strides
])
def test_launch_shape(pairs, segment, vector, expected):
    assert cupy_backend.launch_shape(pairs, segment, vector) == expected


def test_vector_path_needs_aligned_segments_and_pointers():
    assert cupy_backend.use_vector_path(128, 0, 256)
    assert not cupy_backend.use_vector_path(120, 0, 256)  # segment not a multiple of 16
    assert not cupy_backend.use_vector_path(128, 0, 257)  # misaligned staging
    assert not cupy_backend.use_vector_path(128, 8, 256)  # misaligned pool

