"""Between speckv's block layout and vLLM's paged KV tensors, CPU or CUDA.

vLLM 0.32 hands a connector one view per attention layer of logical shape
[num_blocks, num_kv_heads, block_size, 2 * head_dim] (v1/kv_cache_interface.py:
create_kv_cache_views), whose strides follow the resolved KVCacheLayout
(LBHNC, LBNHC, BLHNC, ...: layers may even interleave per block). What the
2 * head_dim "content" holds depends on the attention backend (PageKind):

- CPU_HALVES, the CPU attention backend (cpu_attn.py): its kernels view
  each (block, head) as [2 * block_size, head_dim] and split it in halves,
  so a block's bytes per head are [2 (K, V)][block_size][head_dim];
- CONTENT_HALVES, the CUDA backends (flash_attn.py, flashinfer.py,
  triton_attn.py, flex_attention.py: `kv_cache.transpose(1, 2).split(
  head_size, dim=-1)`): each (block, head, token) row holds K then V.

page_views turns either into one logical view per layer, [blocks, 2 (K, V),
block_size, heads, head_dim], with no copy: speckv's canonical block
(services/common/geometry.py) is [layers][2][block_size][heads][head_dim],
so every copy below is "this view's pages <-> that canonical array", one
strided copy per layer and run of consecutive pages, whatever the engine's
physical layout. Its innermost run is one head_dim row.

Same host (the kvstore's pool mapped, services/kvstore/shm): pool_to_pages
and pages_to_pool copy straight between the kvstore's layer-major pool
[layers][2][pages][block_size][heads][head_dim] and the engine's pages,
with no canonical staging in between; pool_to_pages_layer is one layer of
it (the layer by layer loads of layer_loads.py).

Bytes move, no value is converted (bf16, fp8 and NaN payloads included):
page_arrays gives each layer's view as unsigned integers of its element
size. CPU pages become NumPy arrays, and every copy is NumPy's, on the
calling thread alone with the GIL released: torch's copy_ would split each
copy over the engine's intra-op threads, and a split copy waits for its
slowest half (0.3x memcpy against one thread's 0.7x on a busy machine,
docs/journal/vllm_connector.md, 2026-12-06). CUDA pages stay torch tensors
and the copies are torch's (host<->device, the layout conversion done by a
strided copy on the device), ordered on the calling thread's current
stream; cuda_settle makes them complete before another thread signals them.
"""
from __future__ import annotations

import enum
import warnings
from typing import Mapping, Sequence, Union

import numpy as np
import torch

from speckv.services.engine.vllm_connector.identity import CPU_PAGE_LAYOUT, CUDA_PAGE_LAYOUT
from speckv.services.kvstore.shm.runs import Run, paired_runs

Pages = Union[np.ndarray, torch.Tensor]  # one layer's [blocks, 2, N, H, C] of unsigned ints (page_arrays)
_TORCH_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class PageKind(enum.Enum):
    """What a vLLM page's content holds; the value is identity.KVLayout.page_layout."""

    CPU_HALVES = CPU_PAGE_LAYOUT  # per (block, head): [2][block_size][head_dim]
    CONTENT_HALVES = CUDA_PAGE_LAYOUT  # per (block, head, token): [2][head_dim]


DEVICE_KINDS = {"cpu": PageKind.CPU_HALVES, "cuda": PageKind.CONTENT_HALVES}
# vLLM 0.32's attention backends (AttentionBackend.get_name()) whose pages pages.py reads, by kind; another
# backend (MLA's latent pages, NVFP4's head groups, a new one) is refused rather than read in a guessed layout.
BACKEND_KINDS = {"CPU_ATTN": PageKind.CPU_HALVES, "FLASH_ATTN": PageKind.CONTENT_HALVES,
                 "FLASHINFER": PageKind.CONTENT_HALVES, "TRITON_ATTN": PageKind.CONTENT_HALVES,
                 "FLEX_ATTENTION": PageKind.CONTENT_HALVES}


def kind_for_device(device: str) -> PageKind | None:
    """The page kind of vLLM's attention backends on this device type (None: not converted)."""
    return DEVICE_KINDS.get(device)


def pages_refused(kind: PageKind, backends: Mapping[str, str | None], devices: Mapping[str, str]) -> str:
    """Why these layers' pages cannot be read as `kind` ("" when they can):
    backends and devices by layer name (a backend None: not known)."""
    for name, backend in sorted(backends.items()):
        if BACKEND_KINDS.get(backend or "") is not kind:
            return f"layer {name}: attention backend {backend!r}, pages of {kind.value!r} expected"
    for name, device in sorted(devices.items()):
        if DEVICE_KINDS.get(device) is not kind:
            return f"layer {name}: KV cache on {device!r}, pages of {kind.value!r} expected"
    return ""


def page_views(caches: Sequence[torch.Tensor], num_kv_heads: int, block_size: int, head_dim: int,
               kind: PageKind = PageKind.CPU_HALVES) -> list[torch.Tensor]:
    """Each layer's cache as [num_blocks, 2, block_size, heads, head_dim] (a
    view: no copy). ValueError when a tensor has another shape, or its
    head_dim rows are not contiguous (a layout this conversion does not know)."""
    if len({cache.dtype for cache in caches}) > 1:
        # vLLM's kv_cache_dtype_skip_layers keeps some layers in another dtype: one block, one element size.
        raise ValueError(f"KV caches of mixed dtypes {sorted({str(c.dtype) for c in caches})}")
    views = []
    for cache in caches:
        expected = (num_kv_heads, block_size, 2 * head_dim)
        if cache.dim() != 4 or tuple(cache.shape[1:]) != expected or cache.stride(3) != 1:
            raise ValueError(f"KV cache {tuple(cache.shape)} strides {cache.stride()}: expected "
                             f"[blocks, {expected}] with contiguous rows")
        blocks, step_block, step_head = cache.shape[0], cache.stride(0), cache.stride(1)
        if kind is PageKind.CPU_HALVES:
            if cache.stride(2) != 2 * head_dim:
                raise ValueError(f"KV cache strides {cache.stride()}: the CPU backend's [block_size, 2 * head_dim] "
                                 "of a (block, head) must be contiguous")
            split = cache.as_strided((blocks, num_kv_heads, 2, block_size, head_dim),
                                     (step_block, step_head, block_size * head_dim, head_dim, 1))
            views.append(split.permute(0, 2, 3, 1, 4))
        else:
            views.append(cache.unflatten(3, (2, head_dim)).permute(0, 3, 2, 1, 4))
    return views


def page_arrays(views: Sequence[torch.Tensor]) -> list[Pages]:
    """page_views' tensors as unsigned integers of their element size, the
    same memory (writes land in the engine's pages): NumPy arrays for CPU
    pages, torch tensors for device pages."""
    arrays: list[Pages] = []
    for view in views:
        size = view.element_size()
        if size not in _TORCH_INTS:
            raise ValueError(f"KV pages of {view.dtype}: expected elements of 1, 2, 4 or 8 bytes")
        ints = view.view(_TORCH_INTS[size])
        arrays.append(raw(ints.numpy()) if view.device.type == "cpu" else ints)
    return arrays


def raw(array: np.ndarray) -> np.ndarray:
    """array's bytes as unsigned integers of its item size (a view)."""
    return array.view(np.dtype(f"u{array.itemsize}"))


def item_size(pages: Pages) -> int:
    return pages.itemsize if isinstance(pages, np.ndarray) else pages.element_size()


def block_bytes(pages: Sequence[Pages]) -> int:
    """Bytes of one canonical block of these pages (every layer)."""
    first = pages[0]
    return len(pages) * int(np.prod(first.shape[1:])) * item_size(first)


def on_device(pages: Sequence[Pages]) -> bool:
    return bool(pages) and isinstance(pages[0], torch.Tensor)


def cuda_settle(pages: Sequence[Pages]) -> None:
    """Waits until the calling thread's copies into device pages are done (a
    no-op for CPU pages): a copy made off the forward's thread must be complete
    before that thread reads the pages."""
    if on_device(pages):
        torch.cuda.current_stream(pages[0].device).synchronize()


def _same_items(pages: Pages, other: Pages) -> None:
    if item_size(pages) != item_size(other):
        raise ValueError(f"pages of {item_size(pages)}-byte items against {item_size(other)}-byte items")


def _copy(target: Pages, source: Pages) -> None:
    """target[...] = source, bytes; NumPy's copy when both are host arrays,
    torch's (across devices) otherwise."""
    if isinstance(target, np.ndarray) and isinstance(source, np.ndarray):
        # Both axes put in the target's memory order: NumPy then writes it front to back (as fast as the
        # contiguous target of the CPU layout before the logical views; 0.7x that in the views' order).
        order = sorted(range(target.ndim), key=lambda axis: -abs(target.strides[axis]))
        np.copyto(target.transpose(order), source.transpose(order))
        return
    if isinstance(source, np.ndarray):
        with warnings.catch_warnings():  # received bytes are read-only: only read here
            warnings.simplefilter("ignore", UserWarning)
            source = _as_torch(source)
    if isinstance(target, np.ndarray):
        target = _as_torch(target)
    target.copy_(source.view(target.dtype))


def _as_torch(array: np.ndarray) -> torch.Tensor:
    """The same memory as a torch tensor of the signed integers page_arrays
    uses (torch's unsigned 16-64 bit types do not copy across devices)."""
    size = array.itemsize
    return torch.from_numpy(array if size == 1 else array.view(np.dtype(f"i{size}")))


def pool_to_pages_layer(pages: Pages, pool: np.ndarray, layer: int, runs: Sequence[Run]) -> None:
    """One layer: pool [layers, 2, pool pages, N, H, C] pages run.src.. into
    pages [engine pages, 2, N, H, C] run.dst.. (runs from paired_runs(pool
    pages, engine pages)), bytes read and written once."""
    _same_items(pages, pool)
    source = raw(pool)[layer]
    for run in runs:
        if isinstance(pages, np.ndarray):
            _copy(pages[run.dst:run.dst + run.count], source[:, run.src:run.src + run.count].transpose(1, 0, 2, 3, 4))
            continue
        for half in (0, 1):  # device pages: each half's pool run [n, N, H, C] is contiguous, copied as it lies
            _copy(pages[run.dst:run.dst + run.count, half], source[half, run.src:run.src + run.count])


def pool_to_pages(pages: Sequence[Pages], pool: np.ndarray, pool_pages: Sequence[int],
                  engine_pages: Sequence[int]) -> None:
    """Copies blocks from the kvstore's pool pages into the engine's pages
    (every layer; page_arrays' arrays)."""
    runs = paired_runs(pool_pages, engine_pages)
    for layer, layer_pages in enumerate(pages):
        pool_to_pages_layer(layer_pages, pool, layer, runs)


def pages_to_pool(pages: Sequence[Pages], engine_pages: Sequence[int], pool: np.ndarray,
                  pool_pages: Sequence[int]) -> None:
    """Copies blocks from the engine's pages into the kvstore's pool pages
    (the reverse of pool_to_pages)."""
    target = raw(pool)
    for run in paired_runs(engine_pages, pool_pages):
        for layer, layer_pages in enumerate(pages):
            _same_items(layer_pages, pool)
            if isinstance(layer_pages, np.ndarray):
                _copy(target[layer, :, run.dst:run.dst + run.count],
                      layer_pages[run.src:run.src + run.count].transpose(1, 0, 2, 3, 4))  # [2, n, N, H, C]
                continue
            for half in (0, 1):  # device pages: into each half's contiguous pool run
                _copy(target[layer, half, run.dst:run.dst + run.count], layer_pages[run.src:run.src + run.count, half])


def gather_blocks(pages: Sequence[Pages], page_ids: Sequence[int]) -> np.ndarray:
    """The given pages as canonical blocks in host memory: [n, layers, 2,
    block_size, heads, head_dim] of page_arrays' integers, contiguous (a copy:
    the pages may be reused after the step)."""
    first = pages[0]
    _pages, _two, block_size, heads, head_dim = first.shape
    out = np.empty((len(page_ids), len(pages), 2, block_size, heads, head_dim), dtype=f"u{item_size(first)}")
    for run in paired_runs(page_ids, range(len(page_ids))):
        for layer, layer_pages in enumerate(pages):
            _copy(out[run.dst:run.dst + run.count, layer], layer_pages[run.src:run.src + run.count])
    return out


def scatter_blocks(pages: Sequence[Pages], page_ids: Sequence[int], blocks: Sequence[np.ndarray]) -> None:
    """Write canonical blocks (each [layers, 2, block_size, heads, head_dim],
    of the pages' item size: a 6-D array or one array per block, e.g. views
    of the received bytes) into the given pages of every layer."""
    if len(blocks) != len(page_ids):
        raise ValueError(f"{len(blocks)} blocks for {len(page_ids)} pages")
    for block, page in zip(blocks, page_ids):
        for layer, layer_pages in enumerate(pages):
            _same_items(layer_pages, block)
            _copy(layer_pages[page], raw(block[layer]))
