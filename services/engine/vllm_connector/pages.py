"""Between speckv's block layout and vLLM CPU attention's paged KV tensors.

vLLM 0.32's CPU attention backend (v1/attention/backends/cpu_attn.py, layout
LBHNC) gives every attention layer one contiguous tensor of nominal shape
[num_blocks, num_kv_heads, block_size, 2 * head_dim]; the kernels view it as
[num_blocks, num_kv_heads, 2 * block_size, head_dim] and split dim 2 in
halves, so the bytes of one block of one layer are really
[num_kv_heads][2 (K, V)][block_size][head_dim]. speckv's canonical block
(services/common/geometry.py) is [num_layers][2][block_size][num_kv_heads]
[head_dim]: converting is a permute per layer whose contiguous runs are one
head_dim row (256 bytes for 64 float32s).

Same host (the kvstore's pool mapped, services/kvstore/shm): pool_to_pages
and pages_to_pool copy straight between the kvstore's layer-major pool
[layers][2][pages][block_size][heads][head_dim] and the engine's pages, one
strided copy per layer and run of consecutive pages, with no canonical
staging in between; pool_to_pages_layer is one layer of it (the layer by
layer loads of layer_loads.py).

Every copy is NumPy's on unsigned-integer views of the same memory
(page_arrays, raw): bytes move, no value is converted (bf16, fp8 and NaN
payloads included), and the copy runs on the calling thread alone with the
GIL released. Torch's copy_ would split each copy over the engine's intra-op
threads (two here: vLLM's CPU worker does not lower them in-process), and a
split copy waits for its slowest half: on a machine whose other cores are
busy that made the load 0.3x memcpy where one thread does 0.7x
(docs/journal/vllm_connector.md, 2026-12-06).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from speckv.services.engine.vllm_connector.identity import CPU_PAGE_LAYOUT
from speckv.services.kvstore.shm.runs import Run, paired_runs

PAGE_LAYOUT = CPU_PAGE_LAYOUT  # what identity.KVLayout.page_layout records for this conversion
_TORCH_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


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


def page_arrays(views: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """page_views' tensors (CPU) as NumPy arrays of unsigned integers of
    their element size: the same memory, so writes land in the engine's pages."""
    arrays = []
    for view in views:
        size = view.element_size()
        if view.device.type != "cpu" or size not in _TORCH_INTS:
            raise ValueError(f"KV pages on {view.device} of {view.dtype}: expected CPU pages of 1, 2, 4 or 8 bytes")
        arrays.append(raw(view.view(_TORCH_INTS[size]).numpy()))
    return arrays


def raw(array: np.ndarray) -> np.ndarray:
    """array's bytes as unsigned integers of its item size (a view)."""
    return array.view(np.dtype(f"u{array.itemsize}"))


def _same_items(pages: np.ndarray, other: np.ndarray) -> None:
    if pages.itemsize != other.itemsize:
        raise ValueError(f"pages of {pages.itemsize}-byte items against {other.itemsize}-byte items")


def pool_to_pages_layer(pages: np.ndarray, pool: np.ndarray, layer: int, runs: Sequence[Run]) -> None:
    """One layer: pool [layers, 2, pool pages, N, H, C] pages run.src.. into
    pages [engine pages, H, 2, N, C] run.dst.. (runs from paired_runs(pool
    pages, engine pages)), bytes read and written once."""
    _same_items(pages, pool)
    source, target = raw(pool)[layer], raw(pages)
    for run in runs:
        np.copyto(target[run.dst:run.dst + run.count],
                  source[:, run.src:run.src + run.count].transpose(1, 3, 0, 2, 4))  # [n, H, 2, N, C]


def pool_to_pages(pages: Sequence[np.ndarray], pool: np.ndarray, pool_pages: Sequence[int],
                  engine_pages: Sequence[int]) -> None:
    """Copies blocks from the kvstore's pool pages into the engine's pages
    (every layer; page_arrays' arrays)."""
    runs = paired_runs(pool_pages, engine_pages)
    for layer, layer_pages in enumerate(pages):
        pool_to_pages_layer(layer_pages, pool, layer, runs)


def pages_to_pool(pages: Sequence[np.ndarray], engine_pages: Sequence[int], pool: np.ndarray,
                  pool_pages: Sequence[int]) -> None:
    """Copies blocks from the engine's pages into the kvstore's pool pages
    (the reverse of pool_to_pages)."""
    target = raw(pool)
    for run in paired_runs(engine_pages, pool_pages):
        for layer, layer_pages in enumerate(pages):
            _same_items(layer_pages, pool)
            np.copyto(target[layer, :, run.dst:run.dst + run.count],
                      raw(layer_pages)[run.src:run.src + run.count].transpose(2, 0, 3, 1, 4))  # [2, n, N, H, C]


def gather_blocks(pages: Sequence[np.ndarray], page_ids: Sequence[int]) -> np.ndarray:
    """The given pages as canonical blocks: [n, layers, 2, block_size, heads,
    head_dim] of page_arrays' integers, contiguous (a copy: the pages may be
    reused after the step)."""
    first = pages[0]
    _pages, heads, _two, block_size, head_dim = first.shape
    out = np.empty((len(page_ids), len(pages), 2, block_size, heads, head_dim), dtype=raw(first).dtype)
    for run in paired_runs(page_ids, range(len(page_ids))):
        for layer, layer_pages in enumerate(pages):
            np.copyto(out[run.dst:run.dst + run.count, layer],
                      raw(layer_pages)[run.src:run.src + run.count].transpose(0, 2, 3, 1, 4))  # [n, 2, N, H, C]
    return out


def scatter_blocks(pages: Sequence[np.ndarray], page_ids: Sequence[int], blocks: Sequence[np.ndarray]) -> None:
    """Write canonical blocks (each [layers, 2, block_size, heads, head_dim],
    of the pages' item size: a 6-D array or one array per block, e.g. views
    of the received bytes) into the given pages of every layer."""
    if len(blocks) != len(page_ids):
        raise ValueError(f"{len(blocks)} blocks for {len(page_ids)} pages")
    for block, page in zip(blocks, page_ids):
        for layer, layer_pages in enumerate(pages):
            _same_items(layer_pages, block)
            np.copyto(raw(layer_pages)[page], raw(block[layer]).transpose(2, 0, 1, 3))  # [H, 2, N, C]
