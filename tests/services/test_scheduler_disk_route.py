"""A scheduler pricing disk loads with a real kvstore that has a disk tier:
the Route answer says how many of the blocks to promote come off the disk
(RouteResponse.disk_blocks, issue 44), so a replay tells a disk load from a
host hit."""
from __future__ import annotations

from pathlib import Path

from speckv.services.common.geometry import preset
from speckv.services.kvstore.disk import records
from speckv.v1 import kvstore_pb2, scheduler_pb2
from tests.support.kvstore_service import kvstore
from tests.support.scheduler_service import scheduler
from tests.support.waiting import TIMEOUT, wait_until

RECORD = records.record_bytes(preset("tiny").bytes_per_block)
CHAIN = [3001, 3002, 3003, 3004, 3005, 3006]
BLOCK_BYTES = preset("tiny").bytes_per_block


def put_chain(kv, hashes, start=0):
    """Puts hashes[start:] (a stream holds as many blocks as the device tier)."""
    def messages():
        for i, h in enumerate(hashes):
            if i < start:
                continue
            yield kvstore_pb2.PutBlockRequest(block_hash=h, data=bytes([i + 1]) * BLOCK_BYTES, family="doc",
                                              parent_hash=hashes[i - 1] if i else 0, has_parent=i > 0)
    return kv.PutBlocks(messages(), timeout=TIMEOUT)


def disk_blocks_indexed(sched) -> int:
    state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    return next((n.num_blocks for n in state.nodes if n.node_id == "n1"), 0)


def test_the_route_answer_counts_the_blocks_read_off_the_disk(tmp_path: Path):
    with scheduler(host_link_gbps=8.0, disk_gbps=8.0, tie_ms=0.1) as (server, sched):
        with kvstore(node_id="n1", geometry="tiny", scheduler=server.address, heartbeat_interval_s=0.2,
                     device_pages=2, host_pages=2, disk_dir=str(tmp_path), disk_bytes=16 * RECORD) as (_, kv):
            assert wait_until(lambda: disk_blocks_indexed(sched) == 0)
            for i in range(0, len(CHAIN), 2):  # 2 device, 2 host, the first 2 down to the disk
                assert put_chain(kv, CHAIN[:i + 2], start=i).stored == 2
            assert wait_until(lambda: disk_blocks_indexed(sched) == len(CHAIN))
            route = sched.Route(scheduler_pb2.RouteRequest(request_id="r", block_hashes=CHAIN,
                                                           prompt_tokens=len(CHAIN) * 4 + 1, family="doc"),
                                timeout=TIMEOUT)
            assert (route.node_id, route.cached_blocks, route.promote_blocks, route.disk_blocks) == ("n1", 6, 4, 2)
