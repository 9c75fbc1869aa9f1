"""CuPy backend: the pool in GPU memory, pack/unpack as the RawKernels of
kv_pack.cu (one CUDA block per (listed block, segment) pair).

Algorithm and thresholds:
- The page list is validated on the host (bounds; no repeats for unpack) and
  copied to the device as int64.
- The 16-byte path (uint4 loads/stores) is taken when segment_bytes % 16 == 0
  and both the pool's and the staging buffer's addresses are 16-byte aligned;
  otherwise the byte path, which only odd test geometries or a deliberately
  misaligned staging buffer ever take.
- blockDim = the segment's word count rounded up to a warp, capped at 256
  threads; gridDim = min(pairs, 65535), the kernels grid-stride over the rest.
- Launches go on CuPy's current stream; `synchronize` waits for the device.

Importing this module needs neither CuPy nor a GPU: CuPy is imported and the
module compiled (NVRTC, cached by CuPy on disk) when a CupyBackend is built,
which raises BackendUnavailable when there is no CuPy or no device.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from speckv.kernels import arrays
from speckv.kernels.backend import BackendUnavailable, check_pages, check_staging, cuda_available, pool_geometry

KERNEL_SOURCE = Path(__file__).with_name("kv_pack.cu")
VECTOR_BYTES = 16
WARP = 32
MAX_THREADS = 256
MAX_GRID = 65535

Array = Any  # cupy.ndarray


def launch_shape(pairs: int, segment_bytes: int, vector: bool) -> tuple[int, int]:
    """(grid, threads) for `pairs` (block, segment) pairs of segment_bytes."""
    words = segment_bytes // VECTOR_BYTES if vector else segment_bytes
    threads = min(MAX_THREADS, max(WARP, -(-words // WARP) * WARP))
    return min(pairs, MAX_GRID), threads


def use_vector_path(segment_bytes: int, *addresses: int) -> bool:
    """16-byte words only when every segment and base address is aligned."""
    return segment_bytes % VECTOR_BYTES == 0 and all(a % VECTOR_BYTES == 0 for a in addresses)


class CupyBackend:
    """Pool and staging in the memory of one CUDA device."""

    name = "cupy"
    on_device = True

    def __init__(self, device: int = 0) -> None:
        try:
            import cupy
        except ImportError as error:
            raise BackendUnavailable("backend=cupy: CuPy is not installed (pip install 'speckv[gpu]')") from error
        if not cuda_available():
            raise BackendUnavailable("backend=cupy: no usable CUDA device (CuPy sees none)")
        self.xp = cupy
        self.device = cupy.cuda.Device(device)
        with self.device:
            module = cupy.RawModule(code=KERNEL_SOURCE.read_text())
            # get_function compiles now, so a broken source fails here, not mid-transfer.
            self._pack = module.get_function("pack_blocks")
            self._unpack = module.get_function("unpack_blocks")

    # ---- memory ---------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        with self.device:
            return self.xp.empty(shape, dtype=dtype)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Array:
        with self.device:
            return self.xp.zeros(shape, dtype=dtype)

    def host_empty(self, nbytes: int) -> np.ndarray:
        memory = self.xp.cuda.alloc_pinned_memory(max(1, nbytes))
        return np.frombuffer(memory, dtype=np.uint8, count=nbytes)

    def holds(self, array: Array) -> bool:
        return isinstance(array, self.xp.ndarray) and array.device.id == self.device.id

    # ---- kernels --------------------------------------------------------
    def pack(self, pool: Array, pages: Sequence[int], out: Array) -> None:
        num_segments, num_pages, segment_bytes = pool_geometry(pool)
        listed = np.asarray(check_pages(pages, num_pages, distinct=False), dtype=np.int64).reshape(-1)
        staging = check_staging(out, listed.size, num_segments * segment_bytes)
        self._launch(self._pack, pool, listed, staging, num_segments, num_pages, segment_bytes, src_first=True)

    def unpack(self, staging: Array, pool: Array, pages: Sequence[int]) -> None:
        num_segments, num_pages, segment_bytes = pool_geometry(pool)
        listed = np.asarray(check_pages(pages, num_pages, distinct=True), dtype=np.int64).reshape(-1)
        flat = check_staging(staging, listed.size, num_segments * segment_bytes)
        self._launch(self._unpack, pool, listed, flat, num_segments, num_pages, segment_bytes, src_first=False)

    def _launch(self, kernel: Any, pool: Array, listed: np.ndarray, staging: Array, num_segments: int,
                num_pages: int, segment_bytes: int, *, src_first: bool) -> None:
        """One launch over len(listed) * num_segments pairs; kernel argument
        order is (source, pages, destination, ...)."""
        for array in (pool, staging):
            if not self.holds(array):
                raise ValueError(f"{type(array).__name__} is not a CuPy array on device {self.device.id}")
        if listed.size == 0:
            return
        vector = use_vector_path(segment_bytes, pool.data.ptr, staging.data.ptr)
        grid, threads = launch_shape(listed.size * num_segments, segment_bytes, vector)
        with self.device:
            pages_device = self.xp.asarray(listed)
            ends = (pool, pages_device, staging) if src_first else (staging, pages_device, pool)
            kernel((grid,), (threads,), (*ends, np.int64(listed.size), np.int64(num_segments),
                                         np.int64(num_pages), np.int64(segment_bytes), np.int32(vector)))

    # ---- plumbing -------------------------------------------------------
    def device_copy(self, src: Array, dst: Array) -> None:
        """cudaMemcpyAsync device to device on the current stream."""
        source, target = self.from_dlpack(src), self.from_dlpack(dst)
        if source.size != target.size:
            raise ValueError(f"copy of {source.size} bytes into {target.size}")
        if source.size:
            target.data.copy_from_device_async(source.data, source.size)

    def synchronize(self) -> None:
        self.device.synchronize()

    def from_dlpack(self, obj: object) -> Array:
        return arrays.device_bytes(obj)

    def to_dlpack(self, array: Array) -> object:
        return array.__dlpack__()
