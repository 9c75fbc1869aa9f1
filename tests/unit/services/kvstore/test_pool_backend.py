"""The pool over its backend on the host: blocks in and out as torch tensors
and NumPy arrays without copies, ranges merged into whole-block runs, and the
backend chosen by select_backend."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from speckv.kernels.backend import NumpyBackend, cuda_available
from speckv.kernels.backend_choice import select_backend
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import KVGeometry, preset
from speckv.services.kvstore.pool import PagePool

BF16 = KVGeometry(2, 2, 6, "bfloat16", 3)  # 72-byte segments, 288-byte blocks


def random_blocks(geometry, count, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=count * geometry.bytes_per_block, dtype=np.uint8)


def test_default_backend_is_plain_host_memory():
    pool = PagePool(preset("tiny"), 2)
    assert pool.backend.name == "numpy" and not pool.on_device
    assert isinstance(pool.data, np.ndarray)


def test_selected_backend_on_this_machine():
    pool = PagePool(preset("tiny"), 3, select_backend("auto"))
    assert pool.on_device == cuda_available()
    data = random_blocks(preset("tiny"), 2)
    pool.unpack(data, [2, 0])
    out = np.empty_like(data)
    pool.pack([2, 0], out)
    assert np.array_equal(out, data)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.uint8])
def test_blocks_in_and_out_as_torch_tensors(dtype):
    pool = PagePool(BF16, 4, NumpyBackend())
    data = random_blocks(BF16, 3, seed=1)
    source = torch.from_numpy(data.copy()).view(dtype)
    pool.unpack(source, [3, 0, 2])
    out = torch.zeros_like(source)
    pool.pack([3, 0, 2], out)  # straight into the tensor's memory
    assert torch.equal(out.view(torch.uint8), source.view(torch.uint8))
    assert pool._staging is None  # host tensors never needed a staging copy


def test_pack_into_a_tensor_view_of_a_larger_buffer():
    pool = PagePool(BF16, 4)
    data = random_blocks(BF16, 1, seed=2)
    pool.unpack(data, [1])
    big = torch.full((3 * BF16.bytes_per_block,), 9, dtype=torch.uint8)
    pool.pack([1], big[BF16.bytes_per_block:])
    assert np.array_equal(big.numpy()[BF16.bytes_per_block: 2 * BF16.bytes_per_block], data)
    assert torch.all(big[: BF16.bytes_per_block] == 9) and torch.all(big[2 * BF16.bytes_per_block:] == 9)


def test_ranges_from_tensors_and_whole_block_runs():
    pages = [3, 1, 0, 2]
    data = random_blocks(BF16, len(pages), seed=3)
    bpb = BF16.bytes_per_block
    pool = PagePool(BF16, 4)
    # One piece cuts block 0, then three whole blocks in one run.
    pool.write_range(pages, 0, torch.from_numpy(data[:5].copy()))
    pool.write_range(pages, 5, torch.from_numpy(data[5:].copy()))
    out = torch.zeros(data.size, dtype=torch.uint8)
    pool.read_range(pages, 0, out)
    assert np.array_equal(out.numpy(), data)
    part = torch.zeros(bpb + 10, dtype=torch.uint8)
    pool.read_range(pages, bpb - 3, part)
    assert np.array_equal(part.numpy(), data[bpb - 3: 2 * bpb + 7])


def test_bad_buffers_are_invalid_arguments():
    pool = PagePool(BF16, 2)
    with pytest.raises(InvalidArgument, match="contiguous"):
        pool.unpack(torch.zeros(2 * BF16.bytes_per_block, dtype=torch.uint8)[::2], [0])
    with pytest.raises(InvalidArgument, match="too small"):
        pool.pack([0, 1], torch.zeros(10, dtype=torch.uint8))


def test_host_buffer_for_staging():
    pool = PagePool(preset("tiny"), 2)
    buffer = pool.host_buffer(3 * pool.bytes_per_block)
    assert buffer.dtype == np.uint8 and buffer.size == 3 * pool.bytes_per_block
    pool.unpack(buffer[: pool.bytes_per_block], [1])  # usable as is
