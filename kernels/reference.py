"""Reference pack/unpack (gather/scatter) of KV blocks between a layer-major
paged pool and a contiguous staging buffer.

Pool layout (vLLM-style, layer-major):

    pool[num_layers][2][num_pages][block_size][num_kv_heads][head_dim]

so one page is 2 * num_layers separate contiguous segments. A staging buffer
holds the listed pages one after another, each in canonical block order

    [num_layers][2][block_size][num_kv_heads][head_dim]

`pack` gathers pages into staging, `unpack` scatters staging into pages. These
are the semantics the GPU kernels (cupy_backend.py) are checked against.

Backend-agnostic: only basic slicing, reshape and slice assignment are used, so
the same code runs on NumPy and CuPy arrays (an "xp-style" array API). The
staging array must be C-contiguous and share the pool's dtype; it may be flat
or already shaped, and may be longer than needed (the tail is left alone).
"""
from __future__ import annotations

from typing import Any, Sequence

Array = Any  # numpy.ndarray or cupy.ndarray


def block_elements(pool: Array) -> int:
    """Elements of one canonical block of this pool."""
    num_layers, two, _pages, block_size, heads, head_dim = pool.shape
    return num_layers * two * block_size * heads * head_dim


def staging_view(pool: Array, staging: Array, count: int) -> Array:
    """staging viewed as (count, layers, 2, block_size, heads, head_dim).

    Raises ValueError when staging is not a C-contiguous array of the pool's
    dtype with room for count blocks (a silent copy would lose the writes).
    """
    if pool.ndim != 6 or pool.shape[1] != 2:
        raise ValueError(f"pool must be [layers][2][pages][block][heads][dim], got shape {pool.shape}")
    if staging.dtype != pool.dtype:
        raise ValueError(f"staging dtype {staging.dtype} != pool dtype {pool.dtype}")
    if not staging.flags.c_contiguous:
        raise ValueError("staging must be C-contiguous")
    needed = count * block_elements(pool)
    flat = staging.reshape(-1)
    if flat.size < needed:
        raise ValueError(f"staging holds {flat.size} elements, {count} blocks need {needed}")
    num_layers, two, _pages, block_size, heads, head_dim = pool.shape
    return flat[:needed].reshape(count, num_layers, two, block_size, heads, head_dim)


def _check_pages(pool: Array, pages: Sequence[int]) -> None:
    num_pages = pool.shape[2]
    for page in pages:
        # Negative indices would silently wrap around in NumPy.
        if not 0 <= page < num_pages:
            raise IndexError(f"page {page} outside 0..{num_pages - 1}")


def pack(pool: Array, pages: Sequence[int], out: Array) -> None:
    """Gathers pages (in list order, repeats allowed) into out."""
    _check_pages(pool, pages)
    blocks = staging_view(pool, out, len(pages))
    for i, page in enumerate(pages):
        # One strided copy of the 2*layers segments of this page.
        blocks[i] = pool[:, :, page]


def unpack(staging: Array, pool: Array, pages: Sequence[int]) -> None:
    """Scatters staging blocks into pages (list order; a repeated page keeps
    the last block written to it)."""
    _check_pages(pool, pages)
    blocks = staging_view(pool, staging, len(pages))
    for i, page in enumerate(pages):
        pool[:, :, page] = blocks[i]
