"""vLLM 0.32's own per-layer KV cache views (v1/kv_cache_interface.py:
create_kv_cache_views) in any KVCacheLayout, and K / V read from them as
vLLM's attention backends read them: the cases of the connector's page
conversion (tests/unit/.../test_page_kinds.py on CPU tensors,
tests/gpu/test_connector_pages_cuda.py on a CUDA device)."""
import numpy as np
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheTensor, compute_layout_strides, create_kv_cache_views
from vllm.v1.kv_cache_layout import KVCacheLayout

HEADS, BLOCK, DIM, LAYERS, PAGES = 2, 32, 16, 3, 9
INTS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def vllm_caches(layout: KVCacheLayout, dtype=torch.bfloat16, device="cpu") -> list[torch.Tensor]:
    """vLLM's per-layer views [blocks, heads, block_size, 2 * head_dim] of one
    backing buffer in this layout, filled with random bits."""
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=DIM, dtype=dtype)
    strides = compute_layout_strides(spec, PAGES, LAYERS, layout)
    size = LAYERS * PAGES * spec.page_size_bytes
    tensor = KVCacheTensor(size=size, layers=[f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)],
                           layer_stride=strides[0], block_stride=strides[1])
    backing = torch.randint(-128, 127, (size,), dtype=torch.int8, device=device)
    return create_kv_cache_views(backing, spec, PAGES, layout, tensor)


def cuda_backend_kv(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [blocks, N, H, C] as flash_attn.py, triton_attn.py and flex_attention.py read them."""
    return cache.transpose(1, 2).split(DIM, dim=-1)


def cpu_backend_kv(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [blocks, H, N, C] as cpu_attn.py reads them."""
    return cache.view(cache.shape[0], HEADS, 2 * BLOCK, DIM).chunk(2, dim=2)


def bits(tensor: torch.Tensor) -> np.ndarray:
    return tensor.contiguous().view(INTS[tensor.dtype]).cpu().numpy()
