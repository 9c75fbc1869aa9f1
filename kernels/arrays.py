"""Foreign arrays in and out of the pool: flat byte views through DLPack.

Blocks arrive and leave as bytes-like objects, NumPy arrays, CuPy arrays or
PyTorch tensors. Each is seen as a flat uint8 array where it lies, with no
copy: host memory as a NumPy array (`np.from_dlpack` for tensors), device
memory as a CuPy array (`cupy.from_dlpack`). Moving bytes between the two
memories is `copy_bytes`, the only place a copy across them happens.

Byte views make every dtype equal: a bf16 tensor, which NumPy cannot name,
crosses DLPack as uint8. Torch tensors are detached first (a view, no copy),
so `requires_grad` does not block the exchange. Non-contiguous inputs are
refused (ValueError) rather than silently copied: a copy would lose writes.

CuPy is imported only when a device array is actually seen, so this module
works on machines without CuPy or a GPU.
"""
from __future__ import annotations

import sys
from enum import Enum
from typing import Any, Protocol, runtime_checkable

import numpy as np

# DLPack device types (dlpack.h) whose memory the CPU can address directly.
_DL_CPU = 1
_DL_CUDA_HOST = 3  # pinned host memory exported by a CUDA library


@runtime_checkable
class SupportsDLPack(Protocol):
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...

    def __dlpack_device__(self) -> tuple[Any, int]: ...


Array = Any  # numpy.ndarray or cupy.ndarray


class Place(Enum):
    HOST = "host"
    DEVICE = "device"


def place_of(obj: object) -> Place:
    """Where obj's bytes are; anything without DLPack is host memory."""
    if isinstance(obj, (np.ndarray, bytes, bytearray, memoryview)):
        return Place.HOST
    if isinstance(obj, SupportsDLPack):
        device_type, _ = obj.__dlpack_device__()
        return Place.HOST if int(device_type) in (_DL_CPU, _DL_CUDA_HOST) else Place.DEVICE
    return Place.HOST


def _torch_bytes(obj: object) -> object:
    """A torch tensor as a detached flat uint8 view (no copy); others as is.

    Looked up in sys.modules rather than imported: if no torch module is
    loaded, obj cannot be a tensor, and importing torch costs seconds.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return obj
    tensor = obj.detach()
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous")
    return tensor.reshape(-1).view(torch.uint8)


def _flat_bytes(array: Array) -> Array:
    if not array.flags.c_contiguous:
        raise ValueError("array must be C-contiguous")
    return array.reshape(-1).view(np.uint8)


def host_bytes(obj: object) -> np.ndarray:
    """obj's bytes as a flat uint8 NumPy array sharing its memory.

    bytes give a read-only view; device arrays raise ValueError (use
    copy_bytes to move them)."""
    if isinstance(obj, np.ndarray):
        return _flat_bytes(obj)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        if not memoryview(obj).c_contiguous:
            raise ValueError("buffer must be C-contiguous")
        return np.frombuffer(obj, dtype=np.uint8)
    if place_of(obj) is not Place.HOST:
        raise ValueError(f"{type(obj).__name__} lives on a device, not in host memory")
    plain = _torch_bytes(obj)
    return _flat_bytes(np.from_dlpack(plain))


def device_bytes(obj: object) -> Array:
    """obj's bytes as a flat uint8 CuPy array sharing its device memory."""
    if place_of(obj) is not Place.DEVICE:
        raise ValueError(f"{type(obj).__name__} lives in host memory, not on a device")
    import cupy  # only reachable when a device array exists, so CuPy is there

    array = obj if isinstance(obj, cupy.ndarray) else cupy.from_dlpack(_torch_bytes(obj))
    return _flat_bytes(array)


def bytes_view(obj: object) -> Array:
    """host_bytes or device_bytes, whichever memory obj lives in."""
    return device_bytes(obj) if place_of(obj) is Place.DEVICE else host_bytes(obj)


def copy_bytes(src: Array, dst: Array) -> None:
    """Copies flat uint8 src into dst of the same size, across memories if
    needed. Copies touching the device are queued on CuPy's current stream,
    so they are ordered with the pack/unpack kernels. Host buffers are free
    again when this returns (a copy from pinned memory would otherwise still
    be reading them); a device-to-device copy may still be in flight."""
    if src.size != dst.size:
        raise ValueError(f"copy of {src.size} bytes into {dst.size}")
    if src.size == 0:
        return
    src_host, dst_host = isinstance(src, np.ndarray), isinstance(dst, np.ndarray)
    if src_host and dst_host:
        dst[:] = src
    elif src_host:
        import cupy

        dst.set(src)
        cupy.cuda.get_current_stream().synchronize()
    elif dst_host:
        src.get(out=dst)  # blocking: waits for the stream, then copies
    else:
        dst.data.copy_from_device_async(src.data, src.size)
