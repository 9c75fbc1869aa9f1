"""The kvstore served for real on loopback: two nodes, real gRPC stubs."""
from __future__ import annotations

import queue
import threading

import grpc
import pytest

from speckv.services.kvstore.checksum import crc32c
from speckv.v1 import common_pb2, kvstore_pb2
from tests.support.kvstore_service import TINY, block_bytes, get, kvstore, put
from tests.support.waiting import TIMEOUT, wait_until

BPB = TINY.bytes_per_block


@pytest.fixture(scope="module")
def nodes():
    with kvstore(node_id="a", device_pages=64) as (server_a, a), kvstore(node_id="b", device_pages=64) as (server_b, b):
        yield (server_a, a), (server_b, b)


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


SENTINEL = (1 << 63) - 7  # a block stored only so a subscription has a sequence to resume from


def subscribe(stub, after=None):
    """Reads a node's event stream on a thread into a queue. With after=None
    it resumes from the node's current sequence (storing a sentinel block
    first if the log is empty), so every later event arrives as a delta no
    matter when the server registers the stream; after=0 asks for a
    snapshot."""
    if after is None:
        if stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).last_event_sequence == 0:
            put(stub, SENTINEL)
        after = stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).last_event_sequence
    out = queue.Queue()
    stream = stub.SubscribeEvents(kvstore_pb2.SubscribeEventsRequest(after_sequence=after), timeout=6 * TIMEOUT)

    def run():
        try:
            for event in stream:
                out.put(event)
        except grpc.RpcError as exc:
            out.put(exc.code())
        out.put(None)

    threading.Thread(target=run, daemon=True).start()
    return stream, out


def next_event(out, want_type):
    while True:
        item = out.get(timeout=TIMEOUT)
        assert isinstance(item, kvstore_pb2.KVEvent), item
        if item.type == want_type:
            return item


def test_put_get_round_trip_is_byte_exact(nodes):
    (_, a), _ = nodes
    reply = put(a, 101, 102, 103)
    assert (reply.stored, reply.already_present) == (3, 0)
    blocks = get(a, 103, 101)
    assert [b.block_hash for b in blocks] == [103, 101]
    assert [b.data for b in blocks] == [block_bytes(103), block_bytes(101)]
    assert all(b.crc32c == crc32c(b.data) for b in blocks)
    assert put(a, 101).already_present == 1


def test_lookup_reports_presence_and_prefix(nodes):
    (_, a), _ = nodes
    put(a, 201, 202, 204)
    reply = a.Lookup(kvstore_pb2.LookupRequest(block_hashes=[201, 202, 203, 204]), timeout=TIMEOUT)
    assert list(reply.present) == [True, True, False, True] and reply.prefix_blocks == 2


def test_pin_unpin_and_stats(nodes):
    (_, a), _ = nodes
    put(a, 301, 302)
    before = a.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
    assert a.Pin(kvstore_pb2.PinRequest(block_hashes=[301, 302]), timeout=TIMEOUT).changed == 2
    stats = a.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
    assert stats.pinned_pages == before.pinned_pages + 2
    assert stats.node_id == "a" and stats.geometry.name == "tiny" and stats.geometry.bytes_per_block == BPB
    assert stats.num_pages == 64 and stats.used_pages + stats.free_pages == 64
    assert stats.pool_bytes == 64 * BPB and stats.blocks_stored_total >= 2
    assert a.Unpin(kvstore_pb2.PinRequest(block_hashes=[301, 302]), timeout=TIMEOUT).changed == 2
    assert code_of(lambda: a.Unpin(kvstore_pb2.PinRequest(block_hashes=[301]), timeout=TIMEOUT)) \
        == grpc.StatusCode.FAILED_PRECONDITION


def test_replicate_makes_blocks_readable_on_target_with_events(nodes):
    (_, a), (server_b, b) = nodes
    stream_a, events_a = subscribe(a)
    stream_b, events_b = subscribe(b)
    try:
        put(a, 401, 402, 403, family="fam")
        stored = next_event(events_a, kvstore_pb2.KV_EVENT_TYPE_STORED)
        assert list(stored.block_hashes) == [401, 402, 403] and stored.family == "fam" and stored.node_id == "a"
        order = common_pb2.ReplicationOrder(order_id="ord-1", family="fam", block_hashes=[401, 402, 403],
                                            source_node="a", target_node="b", target_address=server_b.address,
                                            lease_ms=30_000)
        reply = a.Replicate(kvstore_pb2.ReplicateRequest(order=order), timeout=TIMEOUT)
        assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.order_id == "ord-1"
        assert (reply.blocks_sent, reply.blocks_skipped, reply.bytes_sent) == (3, 0, 3 * BPB)
        committed = next_event(events_b, kvstore_pb2.KV_EVENT_TYPE_COMMITTED)
        assert list(committed.block_hashes) == [401, 402, 403] and committed.order_id == "ord-1"
        assert committed.node_id == "b" and committed.family == "fam"
        assert b.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).replica_pages >= 3
        assert [x.data for x in get(b, 401, 402, 403)] == [block_bytes(h) for h in (401, 402, 403)]
        again = a.Replicate(kvstore_pb2.ReplicateRequest(order=order), timeout=TIMEOUT)
        assert (again.blocks_sent, again.blocks_skipped) == (0, 3)
    finally:
        stream_a.cancel()
        stream_b.cancel()


def test_resumed_subscriber_from_zero_gets_a_snapshot(nodes):
    (_, a), _ = nodes
    put(a, 501)
    stream, out = subscribe(a, after=0)
    try:
        first = out.get(timeout=TIMEOUT)
        assert first.type == kvstore_pb2.KV_EVENT_TYPE_SNAPSHOT and 501 in first.block_hashes
    finally:
        stream.cancel()


def test_replicate_missing_source_blocks_is_failed_precondition(nodes):
    (_, a), (server_b, _) = nodes
    order = common_pb2.ReplicationOrder(order_id="ord-2", block_hashes=[999_001], target_address=server_b.address)
    with pytest.raises(grpc.RpcError) as info:
        a.Replicate(kvstore_pb2.ReplicateRequest(order=order), timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "999001" in info.value.details()


def test_replicate_to_unreachable_target_is_unavailable(nodes):
    (_, a), _ = nodes
    put(a, 601)
    order = common_pb2.ReplicationOrder(order_id="ord-3", block_hashes=[601], target_address="127.0.0.1:1")
    assert code_of(lambda: a.Replicate(kvstore_pb2.ReplicateRequest(order=order), timeout=TIMEOUT)) \
        == grpc.StatusCode.UNAVAILABLE
    assert a.Unpin  # the source's hold was released:
    assert a.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).pinned_pages == 0


def test_handshake_by_hand_and_its_errors(nodes):
    _, (_, b) = nodes
    grant = b.Reserve(kvstore_pb2.ReserveRequest(order_id="h1", block_hashes=[701, 702], lease_ms=10_000),
                      timeout=TIMEOUT)
    assert list(grant.block_hashes) == [701, 702] and grant.bytes_per_block == BPB
    data = block_bytes(701) + block_bytes(702)
    half = [kvstore_pb2.WriteChunkRequest(handle=grant.handle, offset=BPB, data=data[BPB:], crc32c=crc32c(data[BPB:]))]
    assert b.WriteChunks(iter(half), timeout=TIMEOUT).bytes_received == BPB
    commit = kvstore_pb2.CommitRequest(handle=grant.handle, chunk_crc32c={BPB: crc32c(data[BPB:])})
    assert code_of(lambda: b.Commit(commit, timeout=TIMEOUT)) == grpc.StatusCode.FAILED_PRECONDITION
    bad = [kvstore_pb2.WriteChunkRequest(handle=grant.handle, offset=0, data=data[:BPB], crc32c=1)]
    assert code_of(lambda: b.WriteChunks(iter(bad), timeout=TIMEOUT)) == grpc.StatusCode.ABORTED
    assert code_of(lambda: b.Commit(commit, timeout=TIMEOUT)) == grpc.StatusCode.ABORTED
    assert b.Abort(kvstore_pb2.AbortRequest(handle=grant.handle), timeout=TIMEOUT).pages_freed == 0
    assert b.Lookup(kvstore_pb2.LookupRequest(block_hashes=[701, 702]), timeout=TIMEOUT).prefix_blocks == 0
    unknown = [kvstore_pb2.WriteChunkRequest(handle="no-such", offset=0, data=b"x", crc32c=crc32c(b"x"))]
    assert code_of(lambda: b.WriteChunks(iter(unknown), timeout=TIMEOUT)) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: b.Abort(kvstore_pb2.AbortRequest(handle="no-such"), timeout=TIMEOUT)) \
        == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("call", [
    lambda s: s.Lookup(kvstore_pb2.LookupRequest(), timeout=TIMEOUT),
    lambda s: list(s.GetBlocks(kvstore_pb2.GetBlocksRequest(), timeout=TIMEOUT)),
    lambda s: s.Pin(kvstore_pb2.PinRequest(), timeout=TIMEOUT),
    lambda s: s.PutBlocks(iter([]), timeout=TIMEOUT),
    lambda s: s.PutBlocks(iter([kvstore_pb2.PutBlockRequest(block_hash=1, data=b"short")]), timeout=TIMEOUT),
    lambda s: s.Reserve(kvstore_pb2.ReserveRequest(order_id="", block_hashes=[1]), timeout=TIMEOUT),
    lambda s: s.Reserve(kvstore_pb2.ReserveRequest(order_id="x"), timeout=TIMEOUT),
    lambda s: s.Commit(kvstore_pb2.CommitRequest(handle=""), timeout=TIMEOUT),
    lambda s: s.Replicate(kvstore_pb2.ReplicateRequest(order=common_pb2.ReplicationOrder(
        order_id="x", block_hashes=[1])), timeout=TIMEOUT),
], ids=["lookup", "get", "pin", "put-empty", "put-short", "reserve-no-order", "reserve-no-hashes", "commit",
        "replicate-no-target"])
def test_malformed_requests_are_invalid_argument(nodes, call):
    (_, a), _ = nodes
    assert code_of(lambda: call(a)) == grpc.StatusCode.INVALID_ARGUMENT


def test_unknown_hashes_are_not_found(nodes):
    (_, a), _ = nodes
    with pytest.raises(grpc.RpcError) as info:
        get(a, 888_001)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "888001" in info.value.details()
    assert code_of(lambda: a.Pin(kvstore_pb2.PinRequest(block_hashes=[888_002]), timeout=TIMEOUT)) \
        == grpc.StatusCode.NOT_FOUND


def test_full_pool_is_resource_exhausted_without_losing_blocks():
    with kvstore(node_id="small", device_pages=4) as (_, stub):
        put(stub, 1, 2, 3, 4)
        stub.Pin(kvstore_pb2.PinRequest(block_hashes=[1, 2, 3, 4]), timeout=TIMEOUT)
        with pytest.raises(grpc.RpcError) as info:
            put(stub, 5)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "pinned" in info.value.details()
        assert [b.data for b in get(stub, 1, 2, 3, 4)] == [block_bytes(h) for h in (1, 2, 3, 4)]
        reserve = kvstore_pb2.ReserveRequest(order_id="o", block_hashes=[9])
        assert code_of(lambda: stub.Reserve(reserve, timeout=TIMEOUT)) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_oversize_message_is_resource_exhausted():
    with kvstore(node_id="tight", max_message_mb=1, chunk_kib=256) as (_, stub):
        big = kvstore_pb2.PutBlockRequest(block_hash=1, data=b"\0" * (2 << 20))
        assert code_of(lambda: stub.PutBlocks(iter([big]), timeout=TIMEOUT)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=[1]), timeout=TIMEOUT).prefix_blocks == 0


def test_event_stream_ends_when_server_stops():
    with kvstore(node_id="stopping") as (server, stub):
        stream, out = subscribe(stub)
        put(stub, 1)
        next_event(out, kvstore_pb2.KV_EVENT_TYPE_STORED)
        server.stop(grace_s=1.0)
        while (item := out.get(timeout=TIMEOUT)) is not None:
            assert isinstance(item, (kvstore_pb2.KVEvent, grpc.StatusCode))
        assert wait_until(lambda: not stream.running() if hasattr(stream, "running") else True)
