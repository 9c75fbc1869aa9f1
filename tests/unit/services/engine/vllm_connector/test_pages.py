import numpy as np
import pytest
import torch

from speckv.services.engine.vllm_connector.pages import (
    gather_blocks, page_views, pages_to_pool, pool_tensor, pool_to_pages, scatter_blocks)

HEADS, BLOCK, DIM, LAYERS, PAGES = 2, 32, 16, 3, 6


def caches():
    return [torch.randn(PAGES, HEADS, BLOCK, 2 * DIM) for _ in range(LAYERS)]


def test_gather_reads_the_cpu_backends_k_and_v_halves():
    layers = caches()
    blocks = gather_blocks(page_views(layers, HEADS, BLOCK, DIM), [4, 1])
    assert blocks.shape == (2, LAYERS, 2, BLOCK, HEADS, DIM)
    # vLLM's CPU kernels: view [pages, heads, 2 * block, dim], K the first half of dim 2, V the second
    kv = layers[2].view(PAGES, HEADS, 2 * BLOCK, DIM)
    key, value = kv.chunk(2, dim=2)
    assert torch.equal(blocks[0, 2, 0, 5, 1], key[4, 1, 5])
    assert torch.equal(blocks[1, 2, 1, 31, 0], value[1, 0, 31])


def test_scatter_is_the_inverse_of_gather():
    source, target = caches(), [torch.zeros(PAGES, HEADS, BLOCK, 2 * DIM) for _ in range(LAYERS)]
    blocks = gather_blocks(page_views(source, HEADS, BLOCK, DIM), [0, 5, 2])
    scatter_blocks(page_views(target, HEADS, BLOCK, DIM), [3, 1, 4], blocks)
    for s, t in zip(source, target):
        assert torch.equal(t[3], s[0]) and torch.equal(t[1], s[5]) and torch.equal(t[4], s[2])
        assert torch.count_nonzero(t[0]) == 0


def test_a_cache_of_another_shape_is_refused():
    try:
        page_views([torch.zeros(PAGES, HEADS, BLOCK, DIM)], HEADS, BLOCK, DIM)
    except ValueError as error:
        assert "expected" in str(error)
    else:
        raise AssertionError("accepted a cache of the wrong shape")


def pool_of(pages):
    """A kvstore pool [layers, 2, pages, block, heads, dim] as torch."""
    return torch.randn(LAYERS, 2, pages, BLOCK, HEADS, DIM)


@pytest.mark.parametrize("n", [0, 1, PAGES - 1, PAGES])
@pytest.mark.parametrize("scattered", [False, True])
def test_pool_to_pages_equals_the_canonical_scatter(n, scattered):
    pool = pool_of(PAGES + 1)
    pool_pages = [6, 0, 3, 1, 5, 2][:n] if scattered else list(range(1, 1 + n))
    engine_pages = [2, 3, 4, 0, 1, 5][:n] if scattered else list(range(n))
    direct = [torch.zeros(PAGES, HEADS, BLOCK, 2 * DIM) for _ in range(LAYERS)]
    staged = [torch.zeros(PAGES, HEADS, BLOCK, 2 * DIM) for _ in range(LAYERS)]
    pool_to_pages(page_views(direct, HEADS, BLOCK, DIM), pool, pool_pages, engine_pages)
    canonical = pool[:, :, pool_pages].permute(2, 0, 1, 3, 4, 5)  # [n, layers, 2, block, heads, dim]
    if n:
        scatter_blocks(page_views(staged, HEADS, BLOCK, DIM), engine_pages, canonical)
    assert all(torch.equal(d, s) for d, s in zip(direct, staged))


@pytest.mark.parametrize("n", [0, 1, PAGES - 1, PAGES])
def test_pages_to_pool_is_the_inverse_of_pool_to_pages(n):
    engine = caches()
    pool = torch.zeros(LAYERS, 2, PAGES + 1, BLOCK, HEADS, DIM)
    engine_pages, pool_pages = [5, 4, 0, 1, 2, 3][:n], [1, 2, 3, 6, 5, 4][:n]
    pages_to_pool(page_views(engine, HEADS, BLOCK, DIM), engine_pages, pool, pool_pages)
    if n:
        assert torch.equal(pool[:, :, pool_pages].permute(2, 0, 1, 3, 4, 5),
                           gather_blocks(page_views(engine, HEADS, BLOCK, DIM), engine_pages))
    untouched = sorted(set(range(PAGES + 1)) - set(pool_pages))
    assert torch.count_nonzero(pool[:, :, untouched]) == 0


def test_pool_tensor_is_the_same_memory():
    array = np.zeros((LAYERS, 2, 2, BLOCK, HEADS, DIM), dtype=np.float16)
    tensor = pool_tensor(array, torch.float16)
    tensor[0, 0, 0, 0, 0, 0] = 3.0
    assert array[0, 0, 0, 0, 0, 0] == 3.0
