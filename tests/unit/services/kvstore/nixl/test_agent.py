"""Two real NIXL agents in one process: metadata loaded, pages written by
NIXL WRITE land byte for byte, and a write to an unknown agent fails
Unavailable. Skipped where NIXL is not installed."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.errors import FailedPrecondition, Unavailable
from speckv.services.common.geometry import preset
from speckv.services.kvstore.nixl.agent import NixlAgent
from speckv.services.kvstore.nixl.layout import write_batches
from speckv.services.kvstore.nixl.loader import NixlLoader

API = NixlLoader().api()
pytestmark = pytest.mark.skipif(API is None, reason="NIXL is not installed")
GEOMETRY = preset("tiny", 16)
FAR_FUTURE = float("inf")


def pool(pages: int, seed: int) -> np.ndarray:
    g = GEOMETRY
    shape = (g.num_layers, 2, pages, g.block_size, g.num_kv_heads, g.head_dim)
    return np.random.default_rng(seed).integers(0, 2**16, shape, dtype=np.uint16).view(g.storage_dtype)


@pytest.fixture(scope="module")
def agents():
    source_pool, target_pool = pool(8, 1), pool(6, 2)
    source = NixlAgent(API, "s", {"GPU": source_pool}, GEOMETRY)
    target = NixlAgent(API, "t", {"GPU": target_pool}, GEOMETRY)
    yield source, source_pool, target, target_pool
    source.close()
    target.close()


def test_a_write_lands_the_pages_byte_for_byte(agents):
    source, source_pool, target, target_pool = agents
    name = source.load_remote(target.metadata())
    assert name == target.name and name.startswith("speckv-t-")
    batches = write_batches(source.region_of(source_pool), target.regions["GPU"], [0, 1, 5], [3, 4, 0], 2)
    assert source.write(name, batches, FAR_FUTURE) == 3 * GEOMETRY.bytes_per_block
    landed, sent = target_pool[:, :, [3, 4, 0]], source_pool[:, :, [0, 1, 5]]
    assert landed.tobytes() == sent.tobytes()  # as bytes: random float16 bits include NaNs


def test_an_unregistered_array_or_unknown_agent_is_refused(agents):
    source, source_pool, target, _ = agents
    with pytest.raises(FailedPrecondition, match="not registered"):
        source.region_of(source_pool.copy())
    batches = write_batches(source.region_of(source_pool), target.regions["GPU"], [0], [0])
    with pytest.raises(Unavailable):
        source.write("speckv-nobody", batches, FAR_FUTURE)
