"""The pool on a GPU (CuPy backend) and in pinned host memory: blocks in and
out as NumPy arrays, CuPy arrays and CUDA torch tensors, zero copy where the
memory matches; byte ranges at any offset; the benchmark helper. Needs a CUDA
device; skipped without one."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.kernels.backend import NumpyBackend, cuda_available
from speckv.kernels.backend_choice import select_backend
from speckv.services.common.geometry import KVGeometry, preset
from speckv.services.kvstore.pool import PagePool

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a CUDA device")]

ODD = KVGeometry(3, 1, 5, "float32", 3)  # 60-byte segments: the byte path
GEOMETRIES = [preset("tiny"), ODD, KVGeometry(2, 2, 64, "bfloat16", 4)]


def random_blocks(geometry, count, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=count * geometry.bytes_per_block, dtype=np.uint8)


@pytest.fixture(scope="module")
def gpu():
    return select_backend("cupy")


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: g.name or f"{g.segment_bytes}B-segments")
def test_host_buffers_in_and_out(gpu, geometry):
    pool = PagePool(geometry, 5, gpu)
    assert pool.on_device and isinstance(pool.data, gpu.xp.ndarray)
    data = random_blocks(geometry, 3)
    pool.unpack(data, [4, 0, 2])
    out = bytearray(data.size)
    pool.pack([4, 0, 2], out)
    assert bytes(out) == data.tobytes()
    pinned = pool.host_buffer(data.size)
    pool.pack([4, 0, 2], pinned)
    assert np.array_equal(pinned, data)


def test_device_buffers_are_used_in_place(gpu):
    cp = gpu.xp
    geometry = preset("tiny")
    pool = PagePool(geometry, 4, gpu)
    data = cp.asarray(random_blocks(geometry, 2, seed=1))
    pool.unpack(data, [1, 3])
    out = cp.zeros_like(data)
    pool.pack([1, 3], out)
    assert bool(cp.array_equal(out, data))
    assert pool._staging is None  # device buffers needed no staging copy


def test_cuda_torch_tensors(gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    geometry = KVGeometry(2, 2, 64, "bfloat16", 4)
    pool = PagePool(geometry, 3, gpu)
    tensor = torch.from_numpy(random_blocks(geometry, 2, seed=2)).cuda().view(torch.bfloat16)
    pool.unpack(tensor, [2, 0])
    out = torch.empty_like(tensor)
    pool.pack([2, 0], out)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.uint8), tensor.view(torch.uint8))
    # The pool itself goes to torch without a copy.
    shared = torch.from_dlpack(pool.data.view(gpu.xp.uint8))
    assert shared.data_ptr() == pool.data.data.ptr


@pytest.mark.parametrize("geometry", [preset("tiny"), ODD], ids=["tiny", "odd"])
def test_ranges_at_any_offset(gpu, geometry):
    pages = [2, 0, 3]
    data = random_blocks(geometry, len(pages), seed=4)
    total = data.size
    cuts = sorted({0, 1, 7, geometry.segment_bytes - 1, geometry.bytes_per_block + 3, total - 1, total})
    pool = PagePool(geometry, 4, gpu)
    for lo, hi in reversed(list(zip(cuts, cuts[1:]))):
        pool.write_range(pages, lo, data[lo:hi])
    out = np.empty(total, dtype=np.uint8)
    pool.read_range(pages, 0, out)
    assert np.array_equal(out, data)


def test_pinned_numpy_pool_round_trip():
    backend = select_backend("numpy")
    assert isinstance(backend, NumpyBackend) and backend.pinned
    geometry = preset("tiny")
    pool = PagePool(geometry, 3, backend)
    assert not pool.data.any()
    data = random_blocks(geometry, 2, seed=6)
    pool.unpack(data, [0, 2])
    import cupy

    device_out = cupy.zeros(data.size, dtype=cupy.uint8)
    pool.pack([0, 2], device_out)  # host pool into a device buffer: one copy across
    assert np.array_equal(cupy.asnumpy(device_out), data)


def test_benchmark_helper_reports_and_verifies(gpu):
    from speckv.kernels.bench import measure_gpu

    result = measure_gpu(preset("llama-3-8b"), blocks=8, repeats=2, warmup=1, backend=gpu)
    assert result["verified"] and result["vector_path"]
    for key in ("device_copy_gbps", "gpu_pack_gbps", "gpu_unpack_gbps"):
        assert result[key] > 0
