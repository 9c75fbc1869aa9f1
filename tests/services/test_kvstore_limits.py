"""The kvstore's limits (issue 23, items 3 and 4; docs/limits.md), served
for real on loopback: idle streams cannot starve unary calls, and one over
the cap is RESOURCE_EXHAUSTED; the TCP data plane caps its connections and
ends silent ones; PutBlocks refuses a bad block at that message; leases,
pins and family names are bounded; undecodable bytes are INVALID_ARGUMENT
with no traceback in the log."""
from __future__ import annotations

import logging
import socket
import threading
from typing import Iterator

import grpc
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.dataplane import wire
from speckv.services.kvstore.dataplane.tcp_target import split_address
from speckv.v1 import kvstore_pb2
from tests.support.kvstore_service import TINY, block_bytes, kvstore, put
from tests.support.waiting import TIMEOUT, wait_until

BPB = TINY.bytes_per_block
MIB_NAME = "f" * (1 << 20)


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.details()
    return info.value.code()


def open_streams(stub, count: int) -> list:
    """count SubscribeEvents calls, each settled: admitted (headers came, the
    call goes on) or refused (the call ended)."""
    calls = [stub.SubscribeEvents(kvstore_pb2.SubscribeEventsRequest(after_sequence=1), timeout=6 * TIMEOUT)
             for _ in range(count)]
    for call in calls:
        call.initial_metadata()  # an admitted stream's headers, or a refused one's end
    return calls


def refused(calls: list) -> list[grpc.StatusCode]:
    return [c.code() for c in calls if c.done()]


def test_idle_event_streams_leave_unary_calls_their_threads_and_one_more_is_refused():
    with kvstore(workers=4, max_streams=40, max_streams_per_peer=40) as (_server, stub):
        put(stub, 1)
        held = open_streams(stub, 40)
        assert refused(held) == []
        extra = open_streams(stub, 5)
        assert refused(extra) == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 5
        for _ in range(8):  # more unary calls than the 4 threads kept for them, one after another
            assert stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=[1]), timeout=TIMEOUT).prefix_blocks == 1
        held[0].cancel()  # a client that goes away gives its slot back
        assert wait_until(lambda: not refused(open_streams(stub, 1)))
        for call in held:
            call.cancel()


def test_one_peer_gets_at_most_its_share_of_the_streams():
    with kvstore(workers=4, max_streams=64, max_streams_per_peer=8) as (_server, stub):
        held = open_streams(stub, 8)
        assert refused(held) == []
        assert refused(open_streams(stub, 1)) == [grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).num_pages == 64
        for call in held:
            call.cancel()


def test_a_put_is_refused_at_its_first_bad_block_before_the_rest_is_sent():
    with kvstore() as (_server, stub):
        sent, release, starved = [], threading.Event(), []

        def messages() -> Iterator[kvstore_pb2.PutBlockRequest]:
            good = kvstore_pb2.PutBlockRequest(block_hash=1, data=block_bytes(1), family="f")
            sent.append(good)
            yield good
            bad = kvstore_pb2.PutBlockRequest(block_hash=2, data=bytes(BPB + 1), family="f")
            sent.append(bad)
            yield bad
            if not release.wait(6 * TIMEOUT):  # the server answers before the stream goes on
                starved.append(True)
            for h in range(3, 100):
                sent.append(h)
                yield kvstore_pb2.PutBlockRequest(block_hash=h, data=block_bytes(h), family="f")

        with pytest.raises(grpc.RpcError) as info:
            stub.PutBlocks(messages(), timeout=6 * TIMEOUT)
        answered_after = len(sent)
        release.set()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "block 1 (hash 2)" in info.value.details()
        assert answered_after == 2 and not starved
        assert stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=[1]), timeout=TIMEOUT).present == [False]


def test_family_names_and_leases_are_bounded():
    with kvstore(max_family_chars=256, max_reservation_lease_s=60.0) as (_server, stub):
        long_put = kvstore_pb2.PutBlockRequest(block_hash=1, data=block_bytes(1), family=MIB_NAME)
        assert code_of(lambda: stub.PutBlocks(iter([long_put]), timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
        reserve = kvstore_pb2.ReserveRequest(order_id="o1", block_hashes=[5], lease_ms=60_001, family="f")
        assert code_of(lambda: stub.Reserve(reserve, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
        reserve = kvstore_pb2.ReserveRequest(order_id="o2", block_hashes=[5], lease_ms=24 * 3600 * 1000, family="f")
        assert code_of(lambda: stub.Reserve(reserve, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
        reserve = kvstore_pb2.ReserveRequest(order_id="o3", block_hashes=[5], lease_ms=10_000, family=MIB_NAME)
        assert code_of(lambda: stub.Reserve(reserve, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
        stats = stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
        assert (stats.used_pages, stats.reserved_pages) == (0, 0)  # nothing refused took a page
        reserve = kvstore_pb2.ReserveRequest(order_id="o4", block_hashes=[5], lease_ms=60_000, family="f" * 256)
        assert stub.Reserve(reserve, timeout=TIMEOUT).handle


def test_a_pin_past_its_lease_is_released():
    clock = ManualClock(1000.0)
    with kvstore(clock=clock, pin_lease_s=30.0) as (_server, stub):
        put(stub, 1, 2)
        assert stub.Pin(kvstore_pb2.PinRequest(block_hashes=[1, 2]), timeout=TIMEOUT).changed == 2
        assert stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).pinned_pages == 2
        clock.advance(30.0)
        assert wait_until(lambda: stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).pinned_pages == 0)
        unpin = kvstore_pb2.PinRequest(block_hashes=[1])
        assert code_of(lambda: stub.Unpin(unpin, timeout=TIMEOUT)) == grpc.StatusCode.FAILED_PRECONDITION


def test_undecodable_bytes_are_invalid_argument_without_a_traceback(caplog):
    caplog.set_level(logging.DEBUG)
    with kvstore() as (server, _stub), grpc.insecure_channel(server.address) as channel:
        lookup = channel.unary_unary("/speckv.v1.KVStore/Lookup")
        put_blocks = channel.stream_unary("/speckv.v1.KVStore/PutBlocks")
        subscribe = channel.unary_stream("/speckv.v1.KVStore/SubscribeEvents")
        bad_utf8 = b"\x1a\x02\xc3\x28"  # field 3 (family), a string, with invalid UTF-8
        calls = {
            "garbled": lambda: lookup(b"\xff\xff\xff\xff", timeout=TIMEOUT),
            "truncated": lambda: lookup(b"\x0a\x05\x01", timeout=TIMEOUT),
            "invalid UTF-8": lambda: put_blocks(iter([bad_utf8]), timeout=TIMEOUT),
            "garbled stream request": lambda: list(subscribe(b"\xff\xff", timeout=TIMEOUT)),
        }
        for what, call in calls.items():
            assert code_of(call) == grpc.StatusCode.INVALID_ARGUMENT, what
        assert lookup(kvstore_pb2.LookupRequest(block_hashes=[1]).SerializeToString(), timeout=TIMEOUT)
    assert [r for r in caplog.records if r.exc_info or "deserializ" in r.getMessage().lower()] == []


def data_address(stub) -> tuple[str, int]:
    grant = stub.Reserve(kvstore_pb2.ReserveRequest(order_id="probe", block_hashes=[999], lease_ms=1000),
                         timeout=TIMEOUT)
    stub.Abort(kvstore_pb2.AbortRequest(handle=grant.handle), timeout=TIMEOUT)
    return split_address(grant.data_address)


def connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=TIMEOUT)
    sock.settimeout(TIMEOUT)
    return sock


def end_reply(sock: socket.socket) -> wire.Reply:
    """An END for a handle never written: a served connection answers OK."""
    sock.sendall(bytes(wire.encode_header(wire.header_buffer(), wire.Kind.END, b"none", 0, 0, 0)))
    return wire.read_reply(sock)


def test_data_plane_connections_over_the_cap_are_refused_at_their_opening_frame():
    with kvstore(data_max_connections=2, data_read_timeout_s=60.0) as (_server, stub):
        address = data_address(stub)
        first, second = connect(address), connect(address)
        assert end_reply(first).status == wire.OK and end_reply(second).status == wire.OK
        third = connect(address)
        reply = end_reply(third)  # its opening frame is in: then it would take a slot, and there is none
        assert reply.status == 8 and "data_max_connections" in reply.message  # RESOURCE_EXHAUSTED
        assert third.recv(1) == b""
        first.close()  # its slot comes back

        def admitted() -> bool:
            sock = connect(address)
            try:
                return end_reply(sock).status == wire.OK
            finally:
                sock.close()

        assert wait_until(admitted)
        second.close()


def test_a_silent_data_plane_connection_is_closed_and_its_pages_freed_before_the_lease():
    clock = ManualClock(1000.0)  # never moves: the lease cannot be what frees the pages
    with kvstore(clock=clock, data_read_timeout_s=0.2) as (_server, stub):
        grant = stub.Reserve(kvstore_pb2.ReserveRequest(order_id="o1", block_hashes=[1, 2], lease_ms=60_000,
                                                        family="f"), timeout=TIMEOUT)
        data = block_bytes(1) + block_bytes(2)
        sock = connect(split_address(grant.data_address))
        sock.sendall(bytes(wire.encode_header(wire.header_buffer(), wire.Kind.CHUNK, grant.handle.encode(), 0,
                                              len(data), crc32c(data))))
        sock.sendall(data[:BPB // 2])  # then silence
        assert sock.recv(1) == b""  # the target hung up
        assert wait_until(lambda: stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).reserved_pages == 0)
        sock.close()
