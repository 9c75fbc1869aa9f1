"""The connector's page conversion against vLLM 0.32's own KV cache views:
every KVCacheLayout that create_kv_cache_views builds, read the way vLLM's
attention backends read them (the CUDA backends' K and V halves of each
token's content; the CPU backend's K and V halves of each (block, head)).
The tensors are CPU tensors: the same torch code runs on a CUDA device
(tests/gpu/test_connector_pages_cuda.py checks it there)."""
import numpy as np
import pytest
import torch
from vllm.v1.kv_cache_layout import KVCacheLayout

from speckv.services.engine.vllm_connector.pages import (
    PageKind, block_bytes, gather_blocks, kind_for_device, page_arrays, page_views, pages_refused, pages_to_pool,
    pool_to_pages, scatter_blocks)
from tests.support.vllm_page_cases import (
    BLOCK, DIM, HEADS, INTS, LAYERS, PAGES, bits, cpu_backend_kv, cuda_backend_kv, vllm_caches)

COUNTS = [0, 1, 4, 5, 6]  # empty, one, and around a run of five


def arrays(caches, kind):
    return page_arrays(page_views(caches, HEADS, BLOCK, DIM, kind))


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda layout: layout.name)
def test_gather_reads_k_and_v_as_the_cuda_backends_do_in_every_layout(layout):
    caches = vllm_caches(layout)
    blocks = gather_blocks(arrays(caches, PageKind.CONTENT_HALVES), [7, 2, 3])
    assert blocks.shape == (3, LAYERS, 2, BLOCK, HEADS, DIM)
    for layer, cache in enumerate(caches):
        key, value = cuda_backend_kv(cache)
        for i, page in enumerate([7, 2, 3]):
            assert np.array_equal(blocks[i, layer, 0], bits(key[page]).view(blocks.dtype))
            assert np.array_equal(blocks[i, layer, 1], bits(value[page]).view(blocks.dtype))


def test_gather_reads_k_and_v_as_the_cpu_backend_does():
    caches = vllm_caches(KVCacheLayout.LBHNC)  # the CPU backend's one layout
    blocks = gather_blocks(arrays(caches, PageKind.CPU_HALVES), [5])
    key, value = cpu_backend_kv(caches[1])
    assert np.array_equal(blocks[0, 1, 0], bits(key[5].transpose(0, 1)).view(blocks.dtype))  # [N, H, C]
    assert np.array_equal(blocks[0, 1, 1], bits(value[5].transpose(0, 1)).view(blocks.dtype))


def test_the_two_kinds_read_the_same_bytes_differently():
    caches = vllm_caches(KVCacheLayout.LBHNC)
    as_cpu = gather_blocks(arrays(caches, PageKind.CPU_HALVES), [1])
    as_cuda = gather_blocks(arrays(caches, PageKind.CONTENT_HALVES), [1])
    assert not np.array_equal(as_cpu, as_cuda)  # a block is never served to an engine of the other kind (digest)
    assert sorted(as_cpu.ravel()) == sorted(as_cuda.ravel())


def test_cpu_halves_refuse_pages_whose_tokens_are_not_contiguous_rows():
    # LBNHC puts a block's heads between its tokens: the CPU backend's halves of [N, 2C] do not exist there.
    with pytest.raises(ValueError, match="CPU backend"):
        page_views(vllm_caches(KVCacheLayout.LBNHC), HEADS, BLOCK, DIM, PageKind.CPU_HALVES)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda layout: layout.name)
@pytest.mark.parametrize("count", COUNTS)
def test_pool_round_trip_is_exact_and_touches_only_its_pages(layout, count):
    source, target = vllm_caches(layout), vllm_caches(layout)
    before = [bits(cache) for cache in target]
    engine_pages, pool_pages = [8, 0, 1, 2, 3, 4][:count], [5, 6, 7, 8, 9, 0][:count]
    pool = np.zeros((LAYERS, 2, 10, BLOCK, HEADS, DIM), dtype=np.uint16)
    pages_to_pool(arrays(source, PageKind.CONTENT_HALVES), engine_pages, pool, pool_pages)
    pool_to_pages(arrays(target, PageKind.CONTENT_HALVES), pool, pool_pages, engine_pages)
    for layer in range(LAYERS):
        key_s, value_s = cuda_backend_kv(source[layer])
        key_t, value_t = cuda_backend_kv(target[layer])
        for page in range(PAGES):
            expected = (key_s, value_s) if page in engine_pages else None
            if expected is None:
                assert np.array_equal(bits(target[layer][page]), before[layer][page])
            else:
                assert np.array_equal(bits(key_t[page]), bits(key_s[page]))
                assert np.array_equal(bits(value_t[page]), bits(value_s[page]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scatter_inverts_gather_across_layouts(dtype):
    source, target = vllm_caches(KVCacheLayout.LBHNC, dtype), vllm_caches(KVCacheLayout.BLNHC, dtype)
    blocks = gather_blocks(arrays(source, PageKind.CONTENT_HALVES), [0, 6])
    scatter_blocks(arrays(target, PageKind.CONTENT_HALVES), [4, 5], list(blocks))
    for layer in range(LAYERS):
        assert np.array_equal(bits(cuda_backend_kv(target[layer])[0][4]), bits(cuda_backend_kv(source[layer])[0][0]))
        assert np.array_equal(bits(cuda_backend_kv(target[layer])[1][5]), bits(cuda_backend_kv(source[layer])[1][6]))


def test_block_bytes_is_one_pages_bytes_in_every_layer():
    pages = arrays(vllm_caches(KVCacheLayout.BLHNC), PageKind.CONTENT_HALVES)
    assert block_bytes(pages) == LAYERS * 2 * BLOCK * HEADS * DIM * 2


def test_devices_map_to_their_backends_kind():
    assert kind_for_device("cpu") is PageKind.CPU_HALVES
    assert kind_for_device("cuda") is PageKind.CONTENT_HALVES
    assert kind_for_device("xpu") is None


def torch_pages(caches, kind=PageKind.CONTENT_HALVES):
    """The pages as torch tensors, as page_arrays leaves CUDA pages: the torch copy path, here on the CPU."""
    return [view.view(INTS[view.dtype]) for view in page_views(caches, HEADS, BLOCK, DIM, kind)]


@pytest.mark.parametrize("count", COUNTS)
def test_the_torch_path_of_device_pages_equals_the_numpy_path(count):
    engine_pages, pool_pages = [8, 0, 1, 2, 3, 4][:count], [5, 6, 7, 8, 9, 0][:count]
    source = vllm_caches(KVCacheLayout.LBNHC)
    pool_np, pool_torch = (np.zeros((LAYERS, 2, 10, BLOCK, HEADS, DIM), dtype=np.uint16) for _ in range(2))
    pages_to_pool(arrays(source, PageKind.CONTENT_HALVES), engine_pages, pool_np, pool_pages)
    pages_to_pool(torch_pages(source), engine_pages, pool_torch, pool_pages)
    assert np.array_equal(pool_np, pool_torch)
    if count:
        assert np.count_nonzero(pool_torch)
    target_np, target_torch = vllm_caches(KVCacheLayout.BHLNC), vllm_caches(KVCacheLayout.BHLNC)
    for a, b in zip(target_np, target_torch):
        b.copy_(a)
    pool_to_pages(arrays(target_np, PageKind.CONTENT_HALVES), pool_np, pool_pages, engine_pages)
    pool_to_pages(torch_pages(target_torch), pool_torch, pool_pages, engine_pages)
    assert all(np.array_equal(bits(a), bits(b)) for a, b in zip(target_np, target_torch))
    gathered = gather_blocks(torch_pages(target_torch), engine_pages)
    assert np.array_equal(gathered, gather_blocks(arrays(target_np, PageKind.CONTENT_HALVES), engine_pages))
    scatter_blocks(torch_pages(target_torch), engine_pages[::-1], list(gathered))
    scatter_blocks(arrays(target_np, PageKind.CONTENT_HALVES), engine_pages[::-1], list(gathered))
    assert all(np.array_equal(bits(a), bits(b)) for a, b in zip(target_np, target_torch))


def test_pages_of_an_unknown_backend_or_another_device_are_refused():
    cuda = PageKind.CONTENT_HALVES
    assert pages_refused(cuda, {"l0": "FLASH_ATTN", "l1": "FLASHINFER"}, {"l0": "cuda", "l1": "cuda"}) == ""
    assert "FLASHMLA" in pages_refused(cuda, {"l0": "FLASH_ATTN", "l1": "FLASHMLA"}, {"l0": "cuda", "l1": "cuda"})
    assert "None" in pages_refused(cuda, {"l0": None}, {"l0": "cuda"})
    assert "'cpu'" in pages_refused(cuda, {"l0": "TRITON_ATTN"}, {"l0": "cpu"})
    assert "CPU_ATTN" in pages_refused(cuda, {"l0": "CPU_ATTN"}, {"l0": "cuda"})
    assert pages_refused(PageKind.CPU_HALVES, {"l0": "CPU_ATTN"}, {"l0": "cpu"}) == ""


def test_caches_of_mixed_dtypes_are_refused():
    # vLLM's kv_cache_dtype_skip_layers: some layers in another dtype, so no one block size fits every layer.
    caches = vllm_caches(KVCacheLayout.LBHNC, torch.bfloat16)[:2] + vllm_caches(KVCacheLayout.LBHNC, torch.float16)[:1]
    with pytest.raises(ValueError, match="mixed dtypes"):
        page_views(caches, HEADS, BLOCK, DIM, PageKind.CONTENT_HALVES)
