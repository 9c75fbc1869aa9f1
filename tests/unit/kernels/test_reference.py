"""The NumPy reference pack/unpack against a brute-force per-element copy."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.kernels import reference
from tests.support.kernels_cases import GEOMETRIES, brute_pack, geometry_id, make_pool, page_lists


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
def test_pack_matches_brute_force(geometry):
    pool = make_pool(*geometry)
    for pages in page_lists(pool.shape[2]):
        out = np.full(len(pages) * reference.block_elements(pool) + 3, 7, dtype=pool.dtype)
        reference.pack(pool, pages, out)
        expected = brute_pack(pool, pages).reshape(-1)
        assert np.array_equal(out[: expected.size].view(np.uint8), expected.view(np.uint8))
        assert np.all(out[expected.size:] == 7)  # the tail is untouched


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
def test_unpack_matches_brute_force(geometry):
    pool = make_pool(*geometry, seed=2)
    for pages in page_lists(pool.shape[2]):
        if len(set(pages)) != len(pages):
            continue  # repeats: last write wins, checked below
        staging = make_pool(*geometry, seed=3)[:, :, : len(pages)].transpose(2, 0, 1, 3, 4, 5).copy()
        target = pool.copy()
        reference.unpack(staging.reshape(-1), target, pages)
        expected = pool.copy()
        for i, page in enumerate(pages):
            for l, kv, t, h, d in np.ndindex(*staging.shape[1:]):
                expected[l, kv, page, t, h, d] = staging[i, l, kv, t, h, d]
        assert np.array_equal(target.view(np.uint8), expected.view(np.uint8))


def test_unpack_repeated_page_keeps_last():
    pool = make_pool(*GEOMETRIES[0])
    blocks = np.stack([pool[:, :, 1], pool[:, :, 2]])
    reference.unpack(blocks, pool, [0, 0])
    assert np.array_equal(pool[:, :, 0].view(np.uint8), pool[:, :, 2].view(np.uint8))


def test_round_trip():
    pool = make_pool(*GEOMETRIES[1])
    pages = [4, 0, 6, 2]
    staging = np.empty(len(pages) * reference.block_elements(pool), dtype=pool.dtype)
    reference.pack(pool, pages, staging)
    other = np.zeros_like(pool)
    reference.unpack(staging, other, pages)
    assert np.array_equal(other[:, :, pages], pool[:, :, pages])


@pytest.mark.parametrize("pages", [[-1], [5], [0, 99]])
def test_out_of_range_pages_are_refused(pages):
    pool = make_pool(*GEOMETRIES[0])
    out = np.empty(10 * reference.block_elements(pool), dtype=pool.dtype)
    with pytest.raises(IndexError):
        reference.pack(pool, pages, out)
    with pytest.raises(IndexError):
        reference.unpack(out, pool, pages)


def test_bad_staging_is_refused():
    pool = make_pool(*GEOMETRIES[0])
    n = reference.block_elements(pool)
    with pytest.raises(ValueError, match="dtype"):
        reference.pack(pool, [0], np.empty(n, dtype=np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        reference.pack(pool, [0], np.empty(2 * n, dtype=pool.dtype)[::2])
    with pytest.raises(ValueError, match="elements"):
        reference.pack(pool, [0, 1], np.empty(n, dtype=pool.dtype))
