"""Host<->device tier moves of the kvstore (services/kvstore/tier.py), timed
for `speckv bench transfer` beside the ceilings of the same run.

demote: blocks copied from the device tier's pool into the host tier's;
promote: back up. Page lists are scattered (every other page, shuffled), as
evictions leave them. On CPU both tiers are NumPy pools and the mover copies
each block directly, so the ceiling is NumPy memcpy of the same bytes; with
CuPy and a device, the device tier is a CuPy pool, the host tier pinned
memory, and the mover makes one staged copy through the pack/unpack kernels:
its ceiling is a plain host<->device copy of the same bytes (pinned), timed
here too. GB/s = 1e9 B/s, best of `repeats`.
"""
from __future__ import annotations

import random
import time
from typing import Any, Callable

import numpy as np

from speckv.kernels.backend import NumpyBackend, cuda_available
from speckv.kernels.backend_choice import select_backend
from speckv.services.common.geometry import KVGeometry
from speckv.services.kvstore.pool import PageId, PagePool
from speckv.services.kvstore.tier import PageMover


def best_gbps(nbytes: int, run: Callable[[], None], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    run()
    sync()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        sync()
        best = min(best, time.perf_counter() - started)
    return nbytes / best / 1e9


def _scattered(blocks: int, seed: int) -> list[PageId]:
    pages = [PageId(p) for p in range(0, 2 * blocks, 2)]
    random.Random(seed).shuffle(pages)
    return pages


def tier_moves(geometry: KVGeometry, blocks: int, repeats: int) -> dict[str, Any]:
    """{"cpu": {...}} and, with a device, {"gpu": {...}}: demote and promote GB/s beside their ceiling."""
    out: dict[str, Any] = {"cpu": _measure(geometry, blocks, repeats, NumpyBackend(), NumpyBackend())}
    if cuda_available():
        out["gpu"] = _measure(geometry, blocks, repeats, select_backend("cupy"), select_backend("numpy"))
    return out


def _measure(geometry: KVGeometry, blocks: int, repeats: int, device_backend, host_backend) -> dict[str, Any]:
    device = PagePool(geometry, 2 * blocks, device_backend)
    host = PagePool(geometry, 2 * blocks, host_backend)
    mover = PageMover(geometry.bytes_per_block, host_backend)
    down, up = _scattered(blocks, 1), _scattered(blocks, 2)
    nbytes = blocks * geometry.bytes_per_block
    sync = device_backend.synchronize
    demote = best_gbps(nbytes, lambda: mover.move(device, down, host, up), repeats, sync)
    promote = best_gbps(nbytes, lambda: mover.move(host, up, device, down), repeats, sync)
    if device_backend.on_device:
        pinned = host_backend.host_empty(nbytes)
        on_device = device_backend.empty((nbytes,), np.dtype(np.uint8))
        ceiling_down = best_gbps(nbytes, lambda: on_device.get(out=pinned), repeats, sync)
        ceiling_up = best_gbps(nbytes, lambda: on_device.set(pinned), repeats, sync)
        ceiling = {"device_to_host_gbps": ceiling_down, "host_to_device_gbps": ceiling_up}
        return {"demote_gbps": demote, "promote_gbps": promote, **ceiling,
                "demote_over_copy": demote / ceiling_down, "promote_over_copy": promote / ceiling_up}
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.ones(nbytes, dtype=np.uint8)
    memcpy = best_gbps(nbytes, lambda: np.copyto(dst, src), repeats)
    return {"demote_gbps": demote, "promote_gbps": promote, "memcpy_gbps": memcpy,
            "demote_over_memcpy": demote / memcpy, "promote_over_memcpy": promote / memcpy}
