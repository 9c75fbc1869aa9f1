"""TCP replication between real kvstores on loopback is byte-identical for
0, 1, n-1, n and n+1 blocks (n blocks to a chunk) and more, without and with
data_plane_auth (each chunk's GMAC then computed beside its send,
services/kvstore/dataplane/tagger.py); the target checks every tag, so a
tag sent late, early or wrong would fail the order. A kill -9 of either end
mid-transfer: test_kvstore_processes.py."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from speckv.services.common.geometry import preset
from speckv.v1 import common_pb2, kvstore_pb2, scheduler_pb2
from tests.support.kvstore_service import get, kvstore, put
from tests.support.kvstore_service import block_bytes as tiny_block
from tests.support.scheduler_service import scheduler
from tests.support.waiting import TIMEOUT, wait_until

GEOMETRY = preset("tiny", 256)  # 32 KiB blocks
CHUNK = 256 * 1024  # n = 8 blocks a chunk: at the tagging thread's threshold and above
PER_CHUNK = CHUNK // GEOMETRY.bytes_per_block
COUNTS = [0, 1, PER_CHUNK - 1, PER_CHUNK, PER_CHUNK + 1, 40]


@contextlib.contextmanager
def pair(auth: str) -> Iterator[tuple]:
    """Two kvstores (32 KiB blocks) registered with a scheduler; data_plane_auth as given."""
    with scheduler() as (sched_server, sched):
        common = {"scheduler": sched_server.address, "heartbeat_interval_s": 0.2, "data_plane_auth": auth,
                  "block_size": 256, "device_pages": 128, "shared_memory": False}
        with kvstore(node_id="src", **common) as (_, src), kvstore(node_id="dst", **common) as (dst_server, dst):
            def registered() -> set[str]:
                state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
                return {n.node_id for n in state.nodes}
            assert wait_until(lambda: registered() == {"src", "dst"})
            yield src, dst, dst_server.address


@pytest.fixture(scope="module", params=["off", "on"])
def nodes(request):
    with pair(request.param) as found:
        yield found


@pytest.mark.parametrize("count", COUNTS)
def test_tcp_replicates_byte_for_byte(nodes, count):
    src, dst, address = nodes
    hashes = list(range(1000 * (count + 1), 1000 * (count + 1) + (count or 2)))
    put(src, *hashes, geometry=GEOMETRY)
    if not count:  # 0 blocks to send: the target holds them all already
        put(dst, *hashes, geometry=GEOMETRY)
    order = common_pb2.ReplicationOrder(order_id=f"o{count}", family="f", block_hashes=hashes, source_node="src",
                                        target_node="dst", target_address=address)
    reply = src.Replicate(kvstore_pb2.ReplicateRequest(order=order, transport="tcp", chunk_bytes=CHUNK),
                          timeout=TIMEOUT)
    assert reply.state == common_pb2.ORDER_STATE_COMMITTED, reply.message
    assert reply.blocks_sent == count and reply.bytes_sent == count * GEOMETRY.bytes_per_block
    assert reply.blocks_skipped == (len(hashes) if not count else 0)
    assert [b.data for b in get(dst, *hashes)] == [tiny_block(h, GEOMETRY) for h in hashes]
    if count:
        assert reply.transport == "tcp"
    stats = dst.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
    assert stats.reserved_pages == 0
