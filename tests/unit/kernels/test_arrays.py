"""Byte views of foreign arrays through DLPack, with torch (CPU) and NumPy:
zero copy both ways, every dtype (bf16 too), refusals for what would need a
hidden copy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from speckv.kernels import arrays
from speckv.kernels.backend import NumpyBackend


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.uint8])
def test_torch_cpu_tensor_is_viewed_in_place(dtype):
    tensor = torch.zeros(3, 5, dtype=dtype)
    view = arrays.host_bytes(tensor)
    assert view.dtype == np.uint8 and view.size == tensor.numel() * tensor.element_size()
    assert view.ctypes.data == tensor.data_ptr()  # the same memory
    view[:] = 0x3F
    assert torch.equal(tensor.view(torch.uint8).reshape(-1), torch.full((view.size,), 0x3F, dtype=torch.uint8))


def test_tensor_that_requires_grad_is_detached_not_copied():
    tensor = torch.zeros(8, requires_grad=True)
    assert arrays.host_bytes(tensor).ctypes.data == tensor.data_ptr()


def test_non_contiguous_inputs_are_refused():
    with pytest.raises(ValueError, match="contiguous"):
        arrays.host_bytes(torch.zeros(4, 4).t())
    with pytest.raises(ValueError, match="contiguous"):
        arrays.host_bytes(np.zeros((4, 4)).T)
    with pytest.raises(ValueError, match="contiguous"):
        arrays.host_bytes(memoryview(bytearray(8))[::2])


def test_places():
    assert arrays.place_of(np.zeros(2)) is arrays.Place.HOST
    assert arrays.place_of(b"x") is arrays.Place.HOST
    assert arrays.place_of(torch.zeros(2)) is arrays.Place.HOST
    with pytest.raises(ValueError, match="host memory"):
        arrays.device_bytes(torch.zeros(2))


def test_bytes_like_views():
    data = bytearray(range(10))
    view = arrays.host_bytes(data)
    view[0] = 99
    assert data[0] == 99
    assert arrays.host_bytes(b"abc").tolist() == [97, 98, 99]
    assert arrays.host_bytes(memoryview(np.arange(3, dtype=np.float32))).size == 12


def test_numpy_pool_round_trips_through_torch():
    """A NumPy pool exported to torch and back: one memory throughout."""
    backend = NumpyBackend()
    pool = backend.zeros((2, 2, 3, 4, 1, 2), np.float32)
    shared = torch.utils.dlpack.from_dlpack(backend.to_dlpack(pool))
    assert shared.data_ptr() == pool.ctypes.data
    shared[1, 0, 2] = 5.0
    assert np.all(pool[1, 0, 2] == 5.0)
    back = np.from_dlpack(shared)
    assert back.ctypes.data == pool.ctypes.data


def test_copy_bytes_checks_sizes():
    src, dst = np.arange(4, dtype=np.uint8), np.zeros(4, dtype=np.uint8)
    arrays.copy_bytes(src, dst)
    assert dst.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="4 bytes into 3"):
        arrays.copy_bytes(src, dst[:3])
