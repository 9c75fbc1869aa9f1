import torch

from speckv.services.engine.vllm_connector.pages import gather_blocks, page_views, scatter_blocks

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
