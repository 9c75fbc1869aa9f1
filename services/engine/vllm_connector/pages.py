"""Between speckv's block layout and vLLM CPU attention's paged KV tensors
(torch index ops on CPU).

vLLM 0.32's CPU attention backend (v1/attention/backends/cpu_attn.py, layout
LBHNC) gives every attention layer one contiguous tensor of nominal shape
[num_blocks, num_kv_heads, block_size, 2 * head_dim]; the kernels view it as
[num_blocks, num_kv_heads, 2 * block_size, head_dim] and split dim 2 in
halves, so the bytes of one block of one layer are really
[num_kv_heads][2 (K, V)][block_size][head_dim]. speckv's canonical block
(services/common/geometry.py) is [num_layers][2][block_size][num_kv_heads]
[head_dim]: converting is one gather and a permute per layer.

Same host (the kvstore's pool mapped, services/kvstore/shm): pool_to_pages
and pages_to_pool copy straight between the kvstore's layer-major pool
[layers][2][pages][block_size][heads][head_dim] and the engine's pages, with
no canonical staging in between.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from speckv.services.engine.vllm_connector.identity import CPU_PAGE_LAYOUT
from speckv.services.kvstore.shm.runs import paired_runs

if TYPE_CHECKING:
    import numpy as np

PAGE_LAYOUT = CPU_PAGE_LAYOUT  # what identity.KVLayout.page_layout records for this conversion


def page_views(caches: Sequence[torch.Tensor], num_kv_heads: int, block_size: int,
               head_dim: int) -> list[torch.Tensor]:
    """Each layer's cache as [num_blocks, heads, 2, block_size, head_dim]
    (a view: no copy). ValueError when a tensor has another shape."""
    views = []
    for cache in caches:
        expected = (num_kv_heads, block_size, 2 * head_dim)
        if tuple(cache.shape[1:]) != expected or not cache.is_contiguous():
            raise ValueError(f"KV cache {tuple(cache.shape)}: expected contiguous [blocks, {expected}]")
        views.append(cache.view(cache.shape[0], num_kv_heads, 2, block_size, head_dim))
    return views


def gather_blocks(views: Sequence[torch.Tensor], page_ids: Sequence[int]) -> torch.Tensor:
    """The given pages as canonical blocks: [n, layers, 2, block_size, heads,
    head_dim], contiguous (a copy: the pages may be reused after the step)."""
    index = torch.tensor(list(page_ids), dtype=torch.long)
    layers = [view.index_select(0, index).permute(0, 2, 3, 1, 4) for view in views]  # [n, 2, N, H, C]
    return torch.stack(layers, dim=1).contiguous()


def scatter_blocks(views: Sequence[torch.Tensor], page_ids: Sequence[int], blocks: torch.Tensor) -> None:
    """Write canonical blocks [n, layers, 2, block_size, heads, head_dim] into
    the given pages of every layer."""
    index = torch.tensor(list(page_ids), dtype=torch.long)
    for layer, view in enumerate(views):
        view.index_copy_(0, index, blocks[:, layer].permute(0, 3, 1, 2, 4))  # [n, H, 2, N, C]


def pool_tensor(pool: "np.ndarray", dtype: torch.dtype) -> torch.Tensor:
    """A kvstore's mapped pool [layers, 2, pages, block_size, heads, head_dim]
    as a torch tensor of the engine's dtype (same bytes, no copy)."""
    return torch.from_numpy(pool).view(dtype)


def pool_to_pages(views: Sequence[torch.Tensor], pool: torch.Tensor, pool_pages: Sequence[int],
                  engine_pages: Sequence[int]) -> None:
    """Copies blocks from the kvstore's pool pages into the engine's pages,
    one strided copy per layer and run of consecutive pages (runs.py): the
    bytes are read and written once."""
    for run in paired_runs(pool_pages, engine_pages):
        source = pool[:, :, run.src:run.src + run.count]  # [L, 2, n, N, H, C]
        for layer, view in enumerate(views):
            view[run.dst:run.dst + run.count].copy_(source[layer].permute(1, 3, 0, 2, 4))  # [n, H, 2, N, C]


def pages_to_pool(views: Sequence[torch.Tensor], engine_pages: Sequence[int], pool: torch.Tensor,
                  pool_pages: Sequence[int]) -> None:
    """Copies blocks from the engine's pages into the kvstore's pool pages
    (the reverse of pool_to_pages)."""
    for run in paired_runs(engine_pages, pool_pages):
        target = pool[:, :, run.dst:run.dst + run.count]
        for layer, view in enumerate(views):
            target[layer].copy_(view[run.src:run.src + run.count].permute(2, 0, 3, 1, 4))  # [2, n, N, H, C]
