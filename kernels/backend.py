"""Array-module backends of the block pool: where its bytes live and how whole
blocks are gathered into (pack) and scattered from (unpack) staging buffers.

One small interface, two implementations:

- NumpyBackend: host memory; pack/unpack are the reference functions of
  speckv.kernels.reference. With `pinned=True` its allocations are
  page-locked (cupy.cuda.alloc_pinned_memory), so copies to and from a GPU
  run at full PCIe speed and can be asynchronous.
- CupyBackend (speckv.kernels.cupy_backend): device memory; pack/unpack are
  the RawKernels of kv_pack.cu.

Both work on bytes: a pool is any C-contiguous
[layers][2][pages][block_size][heads][head_dim] array of fp16, bf16 (uint16
bits) or fp32, and a staging buffer any C-contiguous array in the same memory
with at least len(pages) * bytes_per_block bytes; blocks fill its start in
canonical order and its tail is left alone. Pages must lie in
0..num_pages-1 (IndexError otherwise); unpack refuses repeated pages
(ValueError), because parallel writers to one page would race on a GPU.

`select_backend("auto")` (backend_choice.py) picks CuPy when a CUDA device is usable, else NumPy;
"numpy" on a machine with a device gives pinned host memory.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Protocol, Sequence

import numpy as np

from speckv.kernels import arrays, reference
from speckv.services.common.errors import FailedPrecondition

Array = Any  # numpy.ndarray or cupy.ndarray
CHOICES = ("auto", "numpy", "cupy")


class BackendUnavailable(FailedPrecondition):
    """The requested backend cannot run here (no CuPy, no CUDA device)."""


class Backend(Protocol):
    """Where a pool's bytes live and how blocks move in and out of it."""

    name: str
    xp: ModuleType  # numpy or cupy
    on_device: bool

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        """An uninitialised C-contiguous array in this backend's memory."""

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Array: ...

    def host_empty(self, nbytes: int) -> np.ndarray:
        """A uint8 host buffer for staging (pinned where a device is present)."""

    def holds(self, array: Array) -> bool:
        """Whether array lives in this backend's memory (no copy needed)."""

    def pack(self, pool: Array, pages: Sequence[int], out: Array) -> None:
        """Gathers the listed pages, in list order, into the start of out."""

    def unpack(self, staging: Array, pool: Array, pages: Sequence[int]) -> None:
        """Scatters len(pages) blocks from the start of staging into pages."""

    def device_copy(self, src: Array, dst: Array) -> None:
        """Copies src's bytes into dst (same size) within this memory."""

    def synchronize(self) -> None:
        """Waits until every queued copy and kernel has finished."""

    def from_dlpack(self, obj: object) -> Array:
        """obj as a flat uint8 array in this memory, zero copy (ValueError if
        obj lives in the other memory)."""

    def to_dlpack(self, array: Array) -> object:
        """A DLPack capsule of array, for consumers without from_dlpack(obj)."""


# ---- shared checks ----------------------------------------------------
def pool_geometry(pool: Array) -> tuple[int, int, int]:
    """(num_segments, num_pages, segment_bytes) of a pool array."""
    if pool.ndim != 6 or pool.shape[1] != 2:
        raise ValueError(f"pool must be [layers][2][pages][block][heads][dim], got shape {pool.shape}")
    if not pool.flags.c_contiguous:
        raise ValueError("pool must be C-contiguous")
    layers, _two, num_pages, block_size, heads, head_dim = pool.shape
    return 2 * layers, num_pages, block_size * heads * head_dim * pool.dtype.itemsize


def check_pages(pages: Sequence[int], num_pages: int, *, distinct: bool) -> Sequence[int]:
    """pages, checked: IndexError outside 0..num_pages-1, ValueError on a
    repeat when distinct is asked. Built-in min / max / set rather than NumPy:
    most calls list a block or two, where NumPy's per-call cost dominates."""
    if len(pages) == 0:
        return pages
    low, high = min(pages), max(pages)
    if low < 0 or high >= num_pages:
        raise IndexError(f"page {low if low < 0 else high} outside 0..{num_pages - 1}")
    if distinct and len(set(pages)) != len(pages):
        raise ValueError("unpack: a page is listed twice")
    return pages


def check_staging(staging: Array, count: int, block_bytes: int) -> Array:
    """staging as flat uint8 bytes, holding at least count blocks."""
    if not staging.flags.c_contiguous:
        raise ValueError("staging must be C-contiguous")
    flat = staging.reshape(-1).view(np.uint8)
    if flat.size < count * block_bytes:
        raise ValueError(f"staging holds {flat.size} bytes, {count} blocks need {count * block_bytes}")
    return flat


# ---- host -------------------------------------------------------------
class NumpyBackend:
    """Host memory; the reference pack/unpack. Pinned allocations need CuPy
    and a device (BackendUnavailable otherwise)."""

    name = "numpy"
    xp = np
    on_device = False

    def __init__(self, pinned: bool = False) -> None:
        self.pinned = pinned
        if pinned and not cuda_available():
            raise BackendUnavailable("pinned host memory needs CuPy and a CUDA device")

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if not self.pinned:
            return np.empty(shape, dtype=dtype)
        import cupy

        count = int(np.prod(shape, dtype=np.int64))
        # The array keeps the PinnedMemoryPointer alive through its base.
        memory = cupy.cuda.alloc_pinned_memory(max(1, count * dtype.itemsize))
        return np.frombuffer(memory, dtype=dtype, count=count).reshape(shape)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if not self.pinned:
            return np.zeros(shape, dtype=dtype)  # lazily zeroed pages from the OS
        array = self.empty(shape, dtype)
        array.fill(0)
        return array

    def host_empty(self, nbytes: int) -> np.ndarray:
        return self.empty((nbytes,), np.dtype(np.uint8))

    def holds(self, array: Array) -> bool:
        return isinstance(array, np.ndarray)

    def pack(self, pool: np.ndarray, pages: Sequence[int], out: np.ndarray) -> None:
        num_segments, num_pages, segment_bytes = pool_geometry(pool)
        listed = check_pages(pages, num_pages, distinct=False)
        block_bytes = num_segments * segment_bytes
        flat = check_staging(out, len(listed), block_bytes)
        reference.pack(pool, listed, flat[: len(listed) * block_bytes].view(pool.dtype))

    def unpack(self, staging: np.ndarray, pool: np.ndarray, pages: Sequence[int]) -> None:
        num_segments, num_pages, segment_bytes = pool_geometry(pool)
        listed = check_pages(pages, num_pages, distinct=True)
        block_bytes = num_segments * segment_bytes
        flat = check_staging(staging, len(listed), block_bytes)
        reference.unpack(flat[: len(listed) * block_bytes].view(pool.dtype), pool, listed)

    def device_copy(self, src: np.ndarray, dst: np.ndarray) -> None:
        arrays.copy_bytes(arrays.host_bytes(src), arrays.host_bytes(dst))

    def synchronize(self) -> None:
        """Host copies are synchronous: nothing to wait for."""

    def from_dlpack(self, obj: object) -> np.ndarray:
        return arrays.host_bytes(obj)

    def to_dlpack(self, array: np.ndarray) -> object:
        return array.__dlpack__()


# ---- choice -----------------------------------------------------------
def cuda_available() -> bool:
    """CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except Exception:  # ImportError, or a CUDA runtime/driver error
        return False
