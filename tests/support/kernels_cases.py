"""Shared cases for the pack/unpack tests (tests/unit and tests/gpu): odd and
aligned pool geometries, every storage dtype, and the block counts that break
off-by-one code (0, 1, n-1, n, n+1), with brute-force per-element answers."""
from __future__ import annotations

from typing import Sequence

import numpy as np

# (layers, pages, block_size, heads, head_dim, dtype). Segment bytes in the
# comments: a multiple of 16 can take the GPU's 16-byte path, others cannot.
GEOMETRIES = [
    (2, 5, 4, 2, 8, np.float16),   # 128: vector path
    (3, 7, 3, 1, 5, np.float32),   # 60: odd everything, byte path
    (1, 4, 1, 3, 1, np.uint16),    # 6: bf16 bit patterns, byte path
    (2, 6, 2, 1, 4, np.uint16),    # 16: bf16, the smallest vector segment
    (2, 9, 16, 2, 4, np.float32),  # 512: vector path, several words per thread
    (1, 3, 5, 3, 7, np.float16),   # 210: even but not 16-aligned
]


def geometry_id(geometry: tuple) -> str:
    *dims, dtype = geometry
    return "x".join(map(str, dims)) + "-" + np.dtype(dtype).name


def segment_bytes(geometry: tuple) -> int:
    _layers, _pages, block, heads, dim, dtype = geometry
    return block * heads * dim * np.dtype(dtype).itemsize


def make_pool(layers: int, pages: int, block: int, heads: int, dim: int, dtype: type,
              seed: int = 0) -> np.ndarray:
    """Random bits for 16-bit dtypes (every pattern, NaNs included); random
    normals for fp32."""
    rng = np.random.default_rng(seed)
    shape = (layers, 2, pages, block, heads, dim)
    if np.dtype(dtype).itemsize == 4:
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 2**16, size=shape, dtype=np.uint16).view(dtype)


def brute_pack(pool: np.ndarray, pages: Sequence[int]) -> np.ndarray:
    """The staging a pack must produce, element by element."""
    layers, _, _, block, heads, dim = pool.shape
    out = np.zeros((len(pages), layers, 2, block, heads, dim), dtype=pool.dtype)
    for i, page in enumerate(pages):
        for l, kv, t, h, d in np.ndindex(layers, 2, block, heads, dim):
            out[i, l, kv, t, h, d] = pool[l, kv, page, t, h, d]
    return out


def brute_unpack(staging: np.ndarray, pool: np.ndarray, pages: Sequence[int]) -> np.ndarray:
    """The pool an unpack must leave, element by element (pages distinct)."""
    expected = pool.copy()
    layers, _, _, block, heads, dim = pool.shape
    blocks = staging.reshape(len(pages), layers, 2, block, heads, dim)
    for i, page in enumerate(pages):
        for l, kv, t, h, d in np.ndindex(layers, 2, block, heads, dim):
            expected[l, kv, page, t, h, d] = blocks[i, l, kv, t, h, d]
    return expected


def page_lists(num_pages: int, distinct: bool = False) -> list[list[int]]:
    """0, 1, n-1, n and (unless distinct) n+1 pages, shuffled, for n pages."""
    rng = np.random.default_rng(1)
    n = num_pages
    shuffled = [int(p) for p in rng.permutation(n)]
    lists = [[], [n - 1], shuffled[: n - 1], list(range(n)), shuffled]
    if not distinct:
        lists.append(shuffled + [shuffled[0]])  # n + 1, with a repeat
    return lists


def block_bytes(pool: np.ndarray) -> int:
    layers, _, _, block, heads, dim = pool.shape
    return 2 * layers * block * heads * dim * pool.dtype.itemsize
