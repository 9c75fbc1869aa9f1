"""Real kvstore processes for service tests (see loadgen/bench/transfer/procs.py)."""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import numpy as np

from speckv.loadgen.bench.transfer.procs import KVStoreProcess, start_kvstore
from speckv.services.common.geometry import preset
from speckv.v1 import common_pb2, kvstore_pb2

TIMEOUT = 30.0  # generous: a loaded 2-core machine
# tiny with 256-token blocks: 32 KiB blocks, so 256 KiB chunks carry 8 of them
GEOMETRY_ARGS = ["--geometry", "tiny", "--block-size", "256"]
GEOMETRY = preset("tiny", 256)


def block(h: int) -> bytes:
    return np.random.default_rng(h).integers(0, 256, GEOMETRY.bytes_per_block, dtype=np.uint8).tobytes()


@contextlib.contextmanager
def processes(*specs: tuple[str, Sequence[str]]) -> Iterator[list[KVStoreProcess]]:
    started: list[KVStoreProcess] = []
    try:
        for node_id, args in specs:
            started.append(start_kvstore(node_id, [*GEOMETRY_ARGS, *args]))
        yield started
    finally:
        for process in started:
            process.stop()


def put(process: KVStoreProcess, hashes: Sequence[int]) -> None:
    parents = [None, *hashes[:-1]]
    messages = (kvstore_pb2.PutBlockRequest(block_hash=h, data=block(h), family="f", parent_hash=p or 0,
                                            has_parent=p is not None) for h, p in zip(hashes, parents))
    reply = process.stub.PutBlocks(messages, timeout=TIMEOUT)
    assert reply.stored == len(hashes)


def replicate_request(source: KVStoreProcess, target: KVStoreProcess, hashes: Sequence[int], *,
                      transport: str = "", chunk_bytes: int = 0, order_id: str = "o1") -> kvstore_pb2.ReplicateRequest:
    order = common_pb2.ReplicationOrder(order_id=order_id, block_hashes=list(hashes), source_node=source.node_id,
                                        target_node=target.node_id, target_address=target.address, family="f")
    return kvstore_pb2.ReplicateRequest(order=order, transport=transport, chunk_bytes=chunk_bytes)


def blocks_of(process: KVStoreProcess, hashes: Sequence[int]) -> list[bytes]:
    request = kvstore_pb2.GetBlocksRequest(block_hashes=list(hashes))
    return [b.data for b in process.stub.GetBlocks(request, timeout=TIMEOUT)]


def stats(process: KVStoreProcess) -> kvstore_pb2.StatsResponse:
    return process.stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)


def present(process: KVStoreProcess, hashes: Sequence[int]) -> list[bool]:
    return list(process.stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=list(hashes)), timeout=TIMEOUT).present)
