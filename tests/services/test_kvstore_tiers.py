"""Two tiered kvstores served for real on loopback: events name their tier,
GetStats shows both tiers, Promote brings host hits up, and a replication
order lands in the tier it names (the host tier by default)."""
from __future__ import annotations

import grpc
import pytest

from speckv.v1 import common_pb2, kvstore_pb2
from tests.services.test_kvstore_service import code_of, subscribe
from tests.support.kvstore_service import TINY, block_bytes, get, kvstore, put
from tests.support.waiting import TIMEOUT

BPB = TINY.bytes_per_block


@pytest.fixture(scope="module")
def tiered():
    with kvstore(node_id="ta", device_pages=4, host_pages=8) as (server_a, a), \
            kvstore(node_id="tb", device_pages=4, host_pages=8) as (server_b, b):
        yield (server_a, a), (server_b, b)


def stats(stub) -> kvstore_pb2.StatsResponse:
    return stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)


def test_evicted_blocks_are_demoted_announced_on_cpu_and_promoted_back(tiered):
    (_, a), _ = tiered
    stream, events = subscribe(a)  # stores a sentinel block first: it is the device tier's oldest
    try:
        put(a, 11, 12, 13, 14)  # the device tier holds 4: the sentinel goes down
        put(a, 21, 22)  # then 14 and 13, tail first
        down, gone = [], []
        while len(down) < 3 or len(gone) < 3:
            event = events.get(timeout=TIMEOUT)
            if event.type == kvstore_pb2.KV_EVENT_TYPE_STORED and event.medium == "CPU":
                down += event.block_hashes
            elif event.type == kvstore_pb2.KV_EVENT_TYPE_REMOVED:
                assert event.medium == "GPU" and set(event.block_hashes) <= set(down)  # announced below first
                gone += event.block_hashes
        assert {13, 14} <= set(down) and sorted(gone) == sorted(down)
        s = stats(a)
        assert (s.host_pages, s.host_used_pages, s.blocks_demoted_total, s.blocks_dropped_total) == (8, 3, 3, 0)
        assert s.host_pool_bytes == 8 * BPB
        reply = a.Promote(kvstore_pb2.PromoteRequest(block_hashes=[11, 12, 13, 14]), timeout=TIMEOUT)
        assert reply.promoted == 2 and stats(a).blocks_promoted_total == 2
        assert [x.data for x in get(a, 13, 14)] == [block_bytes(13), block_bytes(14)]
    finally:
        stream.cancel()


def test_a_replication_order_lands_in_the_tier_it_names(tiered):
    (_, a), (server_b, b) = tiered
    put(a, 31, 32, family="fam")
    before = stats(b)
    order = common_pb2.ReplicationOrder(order_id="t-1", family="fam", block_hashes=[31, 32], source_node="ta",
                                        target_node="tb", target_address=server_b.address, lease_ms=30_000,
                                        target_medium="CPU")
    reply = a.Replicate(kvstore_pb2.ReplicateRequest(order=order), timeout=TIMEOUT)
    assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.blocks_sent == 2
    after = stats(b)
    assert after.host_replica_pages == before.host_replica_pages + 2 and after.used_pages == before.used_pages
    assert [x.data for x in get(b, 31, 32)] == [block_bytes(31), block_bytes(32)]


def test_bad_tiers_get_clear_errors(tiered):
    (_, a), _ = tiered
    bad = kvstore_pb2.ReserveRequest(order_id="x", block_hashes=[41], lease_ms=1000, medium="DISK")
    assert code_of(lambda: a.Reserve(bad, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: a.Promote(kvstore_pb2.PromoteRequest(block_hashes=[999]), timeout=TIMEOUT)) \
        == grpc.StatusCode.NOT_FOUND
    with kvstore(node_id="plain", device_pages=4) as (_, plain):
        host = kvstore_pb2.ReserveRequest(order_id="x", block_hashes=[41], lease_ms=1000, medium="CPU")
        assert code_of(lambda: plain.Reserve(host, timeout=TIMEOUT)) == grpc.StatusCode.FAILED_PRECONDITION
        assert stats(plain).host_pages == 0
