"""Every CUDA source under kernels/ compiles for Hopper (sm_90) with nvcc, and
exports its kernels unmangled (cupy.RawModule.get_function looks them up by
their plain names)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support.repo import REPO_ROOT

KERNELS = REPO_ROOT / "kernels"
SOURCES = sorted(KERNELS.rglob("*.cu"))
NVCC = shutil.which("nvcc")


def test_there_are_kernel_sources():
    assert [p.name for p in SOURCES if p.name == "kv_pack.cu"], "kernels/kv_pack.cu is missing"


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this machine")
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(KERNELS)))
def test_compiles_to_ptx_for_sm_90(source, tmp_path):
    ptx = tmp_path / (source.stem + ".ptx")
    result = subprocess.run([NVCC, "--ptx", "-arch=sm_90", "-o", str(ptx), str(source)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"nvcc failed on {source}:\n{result.stderr}"
    entries = re.findall(r"\.visible \.entry (\w+)\(", ptx.read_text())
    assert entries, f"{source} defines no kernel"
    assert all(re.fullmatch(r"[A-Za-z]\w*", name) and not name.startswith("_Z") for name in entries), \
        f"mangled kernel names {entries}: declare them extern \"C\""


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this machine")
def test_pack_kernels_use_16_byte_accesses(tmp_path):
    ptx = tmp_path / "kv_pack.ptx"
    subprocess.run([NVCC, "--ptx", "-arch=sm_90", "-o", str(ptx), str(KERNELS / "kv_pack.cu")],
                   check=True, capture_output=True, timeout=240)
    text = ptx.read_text()
    assert {"pack_blocks", "unpack_blocks"} <= set(re.findall(r"\.visible \.entry (\w+)\(", text))
    assert re.search(r"ld\.global(\.nc)?\.v4\.u32", text), "no 16-byte loads in the vector path"
    assert re.search(r"st\.global\.v4\.u32", text), "no 16-byte stores in the vector path"
