"""A tiered store on a GPU: the device tier in CuPy memory, the host tier in
pinned host memory. Demotion and promotion move blocks byte-exact through
the staged copy (the pack/unpack kernels), for batches of 0, 1, n-1, n and
n+1 blocks where n is the device tier's size. Needs a CUDA device; skipped
without one."""
from __future__ import annotations

import pytest

import numpy as np

from speckv.kernels.backend import cuda_available
from speckv.kernels.backend_choice import select_backend
from speckv.services.common.clock import ManualClock
from speckv.services.common.geometry import preset
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.pool import PagePool
from speckv.services.kvstore.records import BlockWrite
from speckv.services.kvstore.store import KVStoreCore
from speckv.services.kvstore.tier import PageMover

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a CUDA device")]

TINY = preset("tiny")
DEVICE_PAGES = 4


# Local helpers (the GPU machine runs this file without the services' telemetry
# stack that tests.support.kvstore_service imports).
def block_bytes(block_hash: int) -> bytes:
    rng = np.random.default_rng(block_hash)
    return rng.integers(0, 256, TINY.bytes_per_block, dtype=np.uint8).tobytes()


def writes(*hashes: int) -> list[BlockWrite]:
    return [BlockWrite(h, block_bytes(h), "f", p) for h, p in zip(hashes, [None, *hashes[:-1]])]


def read(store: KVStoreCore, *hashes: int) -> list[bytes]:
    return [bytes(buf) for _, buf in store.get_blocks(list(hashes))]


def tiered_gpu_store() -> KVStoreCore:
    return KVStoreCore("g", TINY, DEVICE_PAGES, ManualClock(0.0), backend=select_backend("cupy"),
                       host_pages=4 * DEVICE_PAGES, host_backend=select_backend("numpy"))


@pytest.mark.parametrize("count", [0, 1, DEVICE_PAGES - 1, DEVICE_PAGES, DEVICE_PAGES + 1])
def test_staged_moves_between_a_cupy_and_a_pinned_pool_are_byte_exact(count):
    device = PagePool(TINY, 2 * DEVICE_PAGES + 2, select_backend("cupy"))
    host = PagePool(TINY, 2 * DEVICE_PAGES + 2, select_backend("numpy"))
    mover = PageMover(TINY.bytes_per_block, select_backend("numpy"))
    pages = list(range(0, 2 * count, 2))[:count]
    for i, page in enumerate(pages):
        device.unpack(block_bytes(100 + i), [page])
    into = list(reversed(range(count)))
    assert mover.move(device, pages, host, into) == count * TINY.bytes_per_block
    for i, page in enumerate(into):
        out = bytearray(TINY.bytes_per_block)
        host.pack([page], out)
        assert bytes(out) == block_bytes(100 + i)
    back = [p + 1 for p in pages]
    mover.move(host, into, device, back)
    for i, page in enumerate(back):
        out = bytearray(TINY.bytes_per_block)
        device.pack([page], out)
        assert bytes(out) == block_bytes(100 + i)


def test_a_gpu_store_demotes_to_pinned_memory_and_promotes_back():
    store = tiered_gpu_store()
    store.put_blocks(writes(1, 2, 3, 4))
    store.put_blocks(writes(5, 6, 7))  # 4, 3, 2 demoted
    assert [store.tier_of(h) for h in (1, 2, 3, 4)] == [Tier.DEVICE, Tier.HOST, Tier.HOST, Tier.HOST]
    assert read(store, 2, 3, 4) == [block_bytes(2), block_bytes(3), block_bytes(4)]
    assert store.promote([1, 2, 3, 4]) == 3
    assert read(store, 1, 2, 3, 4) == [block_bytes(h) for h in (1, 2, 3, 4)]
    assert store.stats().blocks_promoted_total == 3
