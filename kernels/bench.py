"""GPU pack/unpack bandwidth next to the device-to-device copy ceiling.

`measure_gpu(geometry)` builds a pool of 2 * blocks pages on the device (by
default about 256 MiB of blocks), fills it with scrambled bytes, and times
with CUDA events, on CuPy's current stream:

- device_copy_gbps: cudaMemcpyAsync of blocks * bytes_per_block bytes from one
  device buffer to another (the ceiling: the same bytes, no gather);
- gpu_pack_gbps: pack of `blocks` pages, in a random order, into staging;
- gpu_unpack_gbps: unpack of that staging into the same pages.

GB/s counts payload bytes once (10^9 bytes / s), like a memcpy benchmark, and
uses the median of `repeats` timed runs after `warmup` untimed ones. The
result also says which kernel path ran and whether an unpack of the packed
bytes into a second pool rebuilt the listed pages byte for byte.

`python -m speckv.kernels.bench [--geometry NAME] [--blocks N] [--json PATH]`
prints the dict as JSON (and writes it with --json). Needs CuPy and a device.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

GB = 1e9
TARGET_BYTES = 256 * 2**20


class GeometryLike(Protocol):
    """What the benchmark needs of a KV geometry (KVGeometry has it)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    name: str

    @property
    def storage_dtype(self) -> np.dtype: ...

    @property
    def bytes_per_block(self) -> int: ...

    @property
    def segment_bytes(self) -> int: ...


def _median_seconds(xp: Any, operation: Callable[[], None], repeats: int, warmup: int) -> float:
    """Median GPU time of operation, measured with CUDA events on the current stream."""
    for _ in range(warmup):
        operation()
    start, end = xp.cuda.Event(), xp.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        operation()
        end.record()
        end.synchronize()
        times.append(xp.cuda.get_elapsed_time(start, end) / 1e3)  # ms -> s
    return statistics.median(times)


def _random_pool(xp: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """A device pool of scrambled bytes: word i holds i * 2654435761 mod 2^32
    (Knuth's multiplicative hash), so every page differs from every other."""
    pool = xp.empty(shape, dtype=dtype)
    flat = pool.reshape(-1).view(xp.uint8)
    words = flat.size // 4
    flat[: words * 4].view(xp.uint32)[...] = xp.arange(words, dtype=xp.uint32) * xp.uint32(2654435761)
    flat[words * 4:] = 7
    return pool


def default_blocks(bytes_per_block: int) -> int:
    """Blocks for about TARGET_BYTES of payload (well past the 60 MB L2 of an
    H200 and launch overhead), between 64 and 65536."""
    return min(65536, max(64, TARGET_BYTES // bytes_per_block))


def measure_gpu(geometry: GeometryLike, *, blocks: int | None = None, repeats: int = 20, warmup: int = 3,
                seed: int = 0, backend: Any = None) -> dict[str, Any]:
    """Device copy, pack and unpack GB/s for `blocks` blocks of geometry
    (default: default_blocks). Raises BackendUnavailable without a device."""
    from speckv.kernels.cupy_backend import CupyBackend, use_vector_path

    gpu = backend if backend is not None else CupyBackend()
    xp = gpu.xp
    g = geometry
    blocks = blocks if blocks is not None else default_blocks(g.bytes_per_block)
    num_pages = 2 * blocks
    shape = (g.num_layers, 2, num_pages, g.block_size, g.num_kv_heads, g.head_dim)
    nbytes = blocks * g.bytes_per_block
    with gpu.device:
        pool = _random_pool(xp, shape, g.storage_dtype)
        pages = [int(p) for p in np.random.default_rng(seed).permutation(num_pages)[:blocks]]
        staging = xp.empty(nbytes, dtype=xp.uint8)
        copy_target = xp.empty(nbytes, dtype=xp.uint8)
        seconds = {
            "copy": _median_seconds(xp, lambda: gpu.device_copy(staging, copy_target), repeats, warmup),
            "pack": _median_seconds(xp, lambda: gpu.pack(pool, pages, staging), repeats, warmup),
            "unpack": _median_seconds(xp, lambda: gpu.unpack(staging, pool, pages), repeats, warmup),
        }
        gpu.pack(pool, pages, staging)
        rebuilt = xp.zeros_like(pool)
        gpu.unpack(staging, rebuilt, pages)
        # Bytes, not values: scrambled bits include NaN patterns.
        verified = bool(xp.array_equal(xp.ascontiguousarray(rebuilt[:, :, pages]).view(xp.uint8),
                                       xp.ascontiguousarray(pool[:, :, pages]).view(xp.uint8)))
        name = xp.cuda.runtime.getDeviceProperties(gpu.device.id)["name"]
    return {
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "geometry": g.name or "custom", "blocks": blocks, "bytes": nbytes,
        "vector_path": use_vector_path(g.segment_bytes, int(pool.data.ptr), int(staging.data.ptr)),
        "repeats": repeats, "verified": verified,
        "device_copy_gbps": nbytes / seconds["copy"] / GB,
        "gpu_pack_gbps": nbytes / seconds["pack"] / GB,
        "gpu_unpack_gbps": nbytes / seconds["unpack"] / GB,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m speckv.kernels.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--geometry", default="llama-3-8b", help="KV geometry preset")
    parser.add_argument("--blocks", type=int, default=None, help="blocks packed per call (default: ~256 MiB)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    from speckv.kernels.backend import BackendUnavailable
    from speckv.services.common.geometry import preset

    try:
        result = measure_gpu(preset(args.geometry), blocks=args.blocks, repeats=args.repeats)
    except BackendUnavailable as error:
        print(f"speckv.kernels.bench: {error}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
