import numpy as np
import pytest
import torch

from speckv.services.engine.vllm_connector.pages import (
    gather_blocks, page_arrays, page_views, pages_to_pool, pool_to_pages, pool_to_pages_layer, raw, scatter_blocks)
from speckv.services.kvstore.shm.runs import paired_runs

HEADS, BLOCK, DIM, LAYERS, PAGES = 2, 32, 16, 3, 6
ENGINE_PAGES, POOL_PAGES = PAGES + 2, PAGES + 3  # room for PAGES + 1 blocks on both sides
COUNTS = [0, 1, PAGES - 1, PAGES, PAGES + 1]  # empty, one, and around a full run
INT_OF = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def caches(pages=ENGINE_PAGES, dtype=torch.float32, fill="random"):
    """Engine caches [pages, heads, block, 2 * dim]; "random" bits (NaN payloads and all) or zeros."""
    shape = (pages, HEADS, BLOCK, 2 * DIM)
    if fill == "zeros":
        return [torch.zeros(shape, dtype=dtype) for _ in range(LAYERS)]
    bits = INT_OF[dtype]
    info = torch.iinfo(bits)
    return [torch.randint(info.min, info.max, shape, dtype=bits).view(dtype) for _ in range(LAYERS)]


def arrays(layers):
    return page_arrays(page_views(layers, HEADS, BLOCK, DIM))


def pool_of(pages=POOL_PAGES, dtype=torch.float32):
    """A kvstore pool [layers, 2, pages, block, heads, dim] as NumPy (its storage: uint16 bits for bf16)."""
    bits = INT_OF[dtype]
    info = torch.iinfo(bits)
    pool = torch.randint(info.min, info.max, (LAYERS, 2, pages, BLOCK, HEADS, DIM), dtype=bits)
    return raw(pool.numpy())


def expected_pages(pool, pool_pages, engine_pages, base):
    """The reference: block by block and layer by layer, [2, N, H, C] of the pool into a page's logical view."""
    out = [layer.copy() for layer in base]
    for src, dst in zip(pool_pages, engine_pages):
        for layer in range(LAYERS):
            out[layer][dst] = pool[layer, :, src]
    return out


def pages_for(count, scattered):
    pool_pages = [8, 0, 3, 1, 5, 2, 7][:count] if scattered else list(range(1, 1 + count))
    engine_pages = [2, 3, 4, 0, 1, 5, 7][:count] if scattered else list(range(count))
    return pool_pages, engine_pages


def test_gather_reads_the_cpu_backends_k_and_v_halves():
    layers = caches()
    blocks = gather_blocks(arrays(layers), [4, 1])
    assert blocks.shape == (2, LAYERS, 2, BLOCK, HEADS, DIM)
    # vLLM's CPU kernels: view [pages, heads, 2 * block, dim], K the first half of dim 2, V the second
    kv = layers[2].view(ENGINE_PAGES, HEADS, 2 * BLOCK, DIM).view(torch.int32).numpy().view(np.uint32)
    key, value = kv[:, :, :BLOCK], kv[:, :, BLOCK:]
    assert np.array_equal(blocks[0, 2, 0, 5, 1], key[4, 1, 5])
    assert np.array_equal(blocks[1, 2, 1, 31, 0], value[1, 0, 31])


def test_page_arrays_are_the_engines_memory():
    layers = caches(fill="zeros")
    pages = arrays(layers)
    pages[1][3, 0, 2, 1, 5] = np.float32(2.5).view(np.uint32)  # page 3, K, token 2, head 1, element 5
    # vLLM's CPU kernels' view [pages, heads, 2 * block, dim]: the K half, token 2
    assert layers[1].view(ENGINE_PAGES, HEADS, 2 * BLOCK, DIM)[3, 1, 2, 5].item() == 2.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scatter_is_the_inverse_of_gather_bit_for_bit(dtype):
    source, target = caches(dtype=dtype), caches(dtype=dtype, fill="zeros")
    blocks = gather_blocks(arrays(source), [0, 5, 2])
    scatter_blocks(arrays(target), [3, 1, 4], blocks)
    for s, t in zip(source, target):
        s, t = s.view(INT_OF[dtype]), t.view(INT_OF[dtype])
        assert torch.equal(t[3], s[0]) and torch.equal(t[1], s[5]) and torch.equal(t[4], s[2])
        assert torch.count_nonzero(t[0]) == 0


def test_scatter_takes_blocks_read_straight_from_received_bytes():
    source, target = caches(), caches(fill="zeros")
    data = [block.tobytes() for block in gather_blocks(arrays(source), [6, 2])]
    shape = (LAYERS, 2, BLOCK, HEADS, DIM)
    scatter_blocks(arrays(target), [0, 7], [np.frombuffer(b, dtype=np.uint32).reshape(shape) for b in data])
    source, target = [s.view(torch.int32) for s in source], [t.view(torch.int32) for t in target]  # NaNs: bits
    assert torch.equal(target[1][0], source[1][6]) and torch.equal(target[2][7], source[2][2])


def test_a_cache_of_another_shape_is_refused():
    with pytest.raises(ValueError, match="expected"):
        page_views([torch.zeros(PAGES, HEADS, BLOCK, DIM)], HEADS, BLOCK, DIM)


def test_pages_and_pool_of_other_item_sizes_are_refused_not_converted():
    with pytest.raises(ValueError, match="byte items"):
        pool_to_pages(arrays(caches()), pool_of(dtype=torch.float16), [0], [0])


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("scattered", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pool_to_pages_equals_the_block_by_block_reference(count, scattered, dtype):
    pool = pool_of(dtype=dtype)
    pool_pages, engine_pages = pages_for(count, scattered)
    target = caches(dtype=dtype)
    before = [layer.copy() for layer in arrays(target)]
    pool_to_pages(arrays(target), pool, pool_pages, engine_pages)
    expected = expected_pages(pool, pool_pages, engine_pages, before)
    assert all(np.array_equal(a, e) for a, e in zip(arrays(target), expected))


@pytest.mark.parametrize("count", COUNTS)
def test_one_layer_at_a_time_fills_that_layer_only(count):
    pool = pool_of()
    pool_pages, engine_pages = pages_for(count, scattered=True)
    target = caches()
    pages = arrays(target)
    before = [layer.copy() for layer in pages]
    runs = paired_runs(pool_pages, engine_pages)
    pool_to_pages_layer(pages[1], pool, 1, runs)
    expected = expected_pages(pool, pool_pages, engine_pages, before)
    assert np.array_equal(pages[1], expected[1])
    assert np.array_equal(pages[0], before[0]) and np.array_equal(pages[2], before[2])


@pytest.mark.parametrize("count", COUNTS)
def test_pages_to_pool_is_the_inverse_of_pool_to_pages(count):
    engine = caches()
    pool = np.zeros((LAYERS, 2, POOL_PAGES, BLOCK, HEADS, DIM), dtype=np.uint32)
    engine_pages, pool_pages = [5, 4, 0, 1, 2, 3, 7][:count], [1, 2, 3, 8, 5, 4, 0][:count]
    pages_to_pool(arrays(engine), engine_pages, pool, pool_pages)
    back = caches(fill="zeros")
    pool_to_pages(arrays(back), pool, pool_pages, engine_pages)
    for e, b in zip(engine, back):
        e, b = e.view(torch.int32), b.view(torch.int32)
        assert all(torch.equal(e[p], b[p]) for p in engine_pages)
    untouched = sorted(set(range(POOL_PAGES)) - set(pool_pages))
    assert np.count_nonzero(pool[:, :, untouched]) == 0
