"""The connector's pages on a CUDA device against the same conversion on
the CPU (NumPy), byte for byte: vLLM's own views in every KVCacheLayout,
0, 1, n-1, n, n+1 pages, loads and saves through the kvstore's pool,
gathers and scatters of canonical blocks. Needs torch with a CUDA device;
skipped without one (kernels/run_gpu_checks.sh runs it where one is lent),
and without vLLM (whose view builder makes the cases). The worker's round
trips on CUDA pages: test_connector_worker_cuda.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA device")]

KVCacheLayout = pytest.importorskip("vllm.v1.kv_cache_layout").KVCacheLayout

from speckv.services.engine.vllm_connector.pages import (  # noqa: E402
    PageKind, gather_blocks, page_arrays, page_views, pages_to_pool, pool_to_pages, scatter_blocks)
from tests.support.vllm_page_cases import BLOCK, DIM, HEADS, LAYERS, bits, vllm_caches  # noqa: E402

KIND = PageKind.CONTENT_HALVES
COUNTS = [0, 1, 4, 5, 6]


def arrays(caches):
    return page_arrays(page_views(caches, HEADS, BLOCK, DIM, KIND))


def on_cuda(caches):
    return [cache.to("cuda") for cache in caches]


def test_cuda_pages_stay_device_tensors():
    pages = arrays(on_cuda(vllm_caches(KVCacheLayout.LBHNC)))
    assert all(isinstance(p, torch.Tensor) and p.is_cuda for p in pages)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda layout: layout.name)
@pytest.mark.parametrize("count", COUNTS)
def test_pool_loads_and_saves_on_cuda_equal_the_cpus(layout, count):
    host = vllm_caches(layout)
    device = [c.to("cuda") for c in host]
    engine_pages, pool_pages = [8, 0, 1, 2, 3, 4][:count], [5, 6, 7, 8, 9, 0][:count]
    pool = np.random.default_rng(count).integers(0, 2 ** 16, (LAYERS, 2, 10, BLOCK, HEADS, DIM), dtype=np.uint16)
    pool_to_pages(arrays(host), pool, pool_pages, engine_pages)
    pool_to_pages(arrays(device), pool, pool_pages, engine_pages)
    torch.cuda.synchronize()
    assert all(np.array_equal(bits(h), bits(d)) for h, d in zip(host, device))
    saved_host, saved_device = (np.zeros_like(pool) for _ in range(2))
    pages_to_pool(arrays(host), engine_pages, saved_host, pool_pages)
    pages_to_pool(arrays(device), engine_pages, saved_device, pool_pages)
    assert np.array_equal(saved_host, saved_device)


@pytest.mark.parametrize("count", COUNTS)
def test_gather_and_scatter_on_cuda_equal_the_cpus(count):
    host = vllm_caches(KVCacheLayout.BLNHC, torch.float16)
    device = on_cuda(host)
    ids = [3, 4, 5, 6, 0, 8][:count]
    gathered = gather_blocks(arrays(device), ids)
    assert np.array_equal(gathered, gather_blocks(arrays(host), ids))
    scatter_blocks(arrays(device), ids[::-1], list(gathered))
    scatter_blocks(arrays(host), ids[::-1], list(gathered))
    torch.cuda.synchronize()
    assert all(np.array_equal(bits(h), bits(d)) for h, d in zip(host, device))
