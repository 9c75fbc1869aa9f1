"""Small helpers the chaos case modules share: block bytes, puts and reads,
state snapshots, bounded waits."""
from __future__ import annotations

import time
from typing import Callable

import grpc
import numpy as np

from speckv.services.common.geometry import preset
from speckv.v1 import common_pb2, kvstore_pb2, scheduler_pb2

TIMEOUT = 10.0  # a deadline per call, generous: the machine is shared; never a measurement
TINY = preset("tiny")
BPB = TINY.bytes_per_block


def block_bytes(block_hash: int) -> bytes:
    """Deterministic bytes per hash: what the rightful writer stores."""
    return np.random.default_rng(block_hash).integers(0, 256, BPB, dtype=np.uint8).tobytes()


def put(stub, hashes: list[int], family: str = "chaos", data: Callable[[int], bytes] = block_bytes,
        timeout: float = TIMEOUT) -> kvstore_pb2.PutBlocksResponse:
    parents = [None, *hashes[:-1]]
    messages = [kvstore_pb2.PutBlockRequest(block_hash=h, data=data(h), family=family, parent_hash=p or 0,
                                            has_parent=p is not None) for h, p in zip(hashes, parents)]
    return stub.PutBlocks(iter(messages), timeout=timeout)


def read(stub, hashes: list[int]) -> list[bytes]:
    return [b.data for b in stub.GetBlocks(kvstore_pb2.GetBlocksRequest(block_hashes=hashes), timeout=TIMEOUT)]


def intact(stub, hashes: list[int]) -> tuple[bool, str]:
    """Whether the blocks still hold their rightful bytes."""
    same = read(stub, hashes) == [block_bytes(h) for h in hashes]
    return same, "stored blocks byte-identical" if same else "STORED BYTES CHANGED"


def stats(stub) -> kvstore_pb2.StatsResponse:
    return stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)


def cluster_state(stub) -> scheduler_pb2.ClusterState:
    return stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)


def nodes(stub) -> dict[str, scheduler_pb2.NodeState]:
    return {n.node_id: n for n in cluster_state(stub).nodes}


def order_total(stub) -> int:
    return sum(c.count for c in cluster_state(stub).orders)


def order(source: str, target: str, address: str, hashes: list[int], order_id: str = "") -> common_pb2.ReplicationOrder:
    return common_pb2.ReplicationOrder(order_id=order_id, family="chaos", block_hashes=hashes, source_node=source,
                                       target_node=target, target_address=address, lease_ms=30_000)


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Polls predicate until true or timeout_s; RPC errors count as not yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return True
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)


def percentile(samples: list[float], q: float) -> float:
    return float(np.percentile(samples, q)) if samples else float("nan")
