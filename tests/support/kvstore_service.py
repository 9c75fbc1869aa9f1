"""Helpers of the kvstore tests, unit and service (imported explicitly)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import grpc
import numpy as np

from speckv.services.common.clock import Clock, ManualClock
from speckv.services.common.geometry import KVGeometry, preset
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.kvstore.server import build_server
from speckv.services.kvstore.records import BlockWrite
from speckv.services.kvstore.store import KVStoreCore
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc
from tests.support.waiting import TIMEOUT

TINY = preset("tiny")


def block_bytes(block_hash: int, geometry: KVGeometry = TINY) -> bytes:
    """Deterministic, hash-specific canonical bytes."""
    rng = np.random.default_rng(block_hash)
    return rng.integers(0, 256, geometry.bytes_per_block, dtype=np.uint8).tobytes()


def writes(*hashes: int, geometry: KVGeometry = TINY, family: str = "f") -> list[BlockWrite]:
    """Blocks chained in the order given."""
    parents = [None, *hashes[:-1]]
    return [BlockWrite(h, block_bytes(h, geometry), family, p) for h, p in zip(hashes, parents)]


def make_store(num_pages: int = 8, node_id: str = "n1", geometry: KVGeometry = TINY,
               clock: Clock | None = None, retention: int = 1000, host_pages: int = 0,
               retain_max_share: float = 0.0) -> KVStoreCore:
    return KVStoreCore(node_id, geometry, num_pages, clock or ManualClock(1000.0), event_retention=retention,
                       host_pages=host_pages, retain_max_share=retain_max_share)


def read(store: KVStoreCore, *hashes: int) -> list[bytes]:
    return [bytes(buf) for _, buf in store.get_blocks(list(hashes))]


def retained_events(store: KVStoreCore) -> list:
    """Every retained event, without blocking."""
    return list(store._events._events)


@contextlib.contextmanager
def kvstore(clock: Clock | None = None, telemetry=None,
            **overrides) -> Iterator[tuple[object, kvstore_pb2_grpc.KVStoreStub]]:
    """A started kvstore server on 127.0.0.1 and a plain stub to it."""
    config = KVStoreConfig(**{"device_pages": 64, **overrides})
    server = build_server(config, telemetry or build_telemetry("kvstore", {}), clock=clock).start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield server, kvstore_pb2_grpc.KVStoreStub(channel)
    finally:
        channel.close()
        server.stop(grace_s=1.0)


def put(stub, *hashes: int, family: str = "f", geometry: KVGeometry = TINY) -> kvstore_pb2.PutBlocksResponse:
    messages = [kvstore_pb2.PutBlockRequest(block_hash=w.block_hash, data=w.data, family=w.family,
                                            parent_hash=w.parent or 0, has_parent=w.parent is not None)
                for w in writes(*hashes, geometry=geometry, family=family)]
    return stub.PutBlocks(iter(messages), timeout=TIMEOUT)


def get(stub, *hashes: int) -> list[kvstore_pb2.BlockData]:
    return list(stub.GetBlocks(kvstore_pb2.GetBlocksRequest(block_hashes=list(hashes)), timeout=TIMEOUT))

