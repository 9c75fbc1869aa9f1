"""The GPU benchmark's sizing and its refusal without a device (the timed
part runs in tests/gpu)."""
from __future__ import annotations

import pytest

from speckv.kernels import bench
from speckv.kernels.backend import cuda_available
from speckv.services.common.geometry import preset


def test_default_payload_is_about_256_mib_within_bounds():
    assert bench.default_blocks(preset("llama-3-8b").bytes_per_block) == 128  # 2 MiB blocks
    assert bench.default_blocks(preset("llama-3-70b").bytes_per_block) == 64  # 5 MiB: at least 64
    assert bench.default_blocks(preset("tiny").bytes_per_block) == 65536      # 512 B: capped


def test_command_without_a_device_says_why(capsys):
    if cuda_available():
        pytest.skip("a CUDA device is present: tests/gpu/test_gpu_pool.py runs the benchmark instead")
    assert bench.main(["--geometry", "tiny", "--blocks", "4"]) == 2
    assert "backend=cupy" in capsys.readouterr().err
