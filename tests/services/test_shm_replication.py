"""Two real kvstore processes on one host replicating through shared memory
(services/kvstore/shm_target.py): byte-identical copies, auto picks it and
falls back to TCP where the target shares nothing, and a kill -9 of either
end mid-transfer leaves no partial block and frees the reservation."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from speckv.v1 import common_pb2
from tests.support.kvstore_procs import (
    TIMEOUT,
    block,
    blocks_of,
    present,
    processes,
    put,
    replicate_request,
    stats,
)
from tests.support.waiting import wait_until

PER_CHUNK = 8  # 32 KiB blocks in the 256 KiB chunks asked below
SLOW = ["--link-gbps", "0.04"]  # 5 MB/s: 300 blocks (9.4 MiB) take ~2 s, long enough to kill in the middle
HASHES = list(range(1, 301))


@pytest.fixture(scope="module")
def pair():
    with processes(("a", []), ("b", [])) as (a, b):
        yield a, b


@pytest.mark.parametrize("count", [1, PER_CHUNK - 1, PER_CHUNK, PER_CHUNK + 1, 100])
def test_shared_memory_replicates_byte_for_byte(pair, count):
    a, b = pair
    hashes = list(range(1000 * count, 1000 * count + count))
    put(a, hashes)
    reply = a.stub.Replicate(replicate_request(a, b, hashes, transport="shm", chunk_bytes=256 * 1024,
                                               order_id=f"o{count}"), timeout=TIMEOUT)
    assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == "shm", reply.message
    assert reply.blocks_sent == count
    assert blocks_of(b, hashes) == [block(h) for h in hashes]
    assert stats(b).reserved_pages == 0 and stats(a).pinned_pages == 0


def test_blocks_the_target_holds_are_not_sent_again(pair):
    a, b = pair
    hashes = [50_001, 50_002]
    put(a, hashes)
    put(b, hashes[:1])
    reply = a.stub.Replicate(replicate_request(a, b, hashes, order_id="skip"), timeout=TIMEOUT)
    assert reply.transport == "shm" and reply.blocks_sent == 1 and reply.blocks_skipped == 1
    assert blocks_of(b, hashes) == [block(h) for h in hashes]
    put_again = [50_003]
    put(a, put_again)
    put(b, put_again)
    reply = a.stub.Replicate(replicate_request(a, b, put_again, order_id="none-left"), timeout=TIMEOUT)
    assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.blocks_sent == 0  # nothing to write


def test_auto_is_shared_memory_on_one_host_and_tcp_to_a_target_sharing_nothing():
    with processes(("a", []), ("b", []), ("c", ["--no-shared-memory", "--no-nixl"])) as (a, b, c):
        put(a, HASHES[:20])
        to_b = a.stub.Replicate(replicate_request(a, b, HASHES[:20]), timeout=TIMEOUT)  # a's default: auto
        to_c = a.stub.Replicate(replicate_request(a, c, HASHES[:20], transport="shm"), timeout=TIMEOUT)
        assert (to_b.transport, to_c.transport) == ("shm", "tcp")
        assert blocks_of(b, HASHES[:20]) == blocks_of(c, HASHES[:20]) == [block(h) for h in HASHES[:20]]


def test_target_killed_mid_copy_fails_the_order_and_leaves_the_source_intact():
    with processes(("a", SLOW), ("b", [])) as (a, b), ThreadPoolExecutor(1) as pool:
        put(a, HASHES)
        call = pool.submit(a.stub.Replicate, replicate_request(a, b, HASHES, transport="shm"), timeout=TIMEOUT)
        assert wait_until(lambda: stats(b).reserved_pages == len(HASHES), timeout=TIMEOUT)
        b.kill()
        with pytest.raises(grpc.RpcError) as failed:
            call.result(timeout=TIMEOUT)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value.details()
        after = stats(a)
        assert after.pinned_pages == 0 and after.used_pages == len(HASHES)
        assert blocks_of(a, HASHES) == [block(h) for h in HASHES]


def test_source_killed_mid_copy_publishes_nothing_and_the_lease_frees_the_reservation():
    with processes(("a", SLOW), ("b", ["--reservation-lease-s", "2"])) as (a, b), ThreadPoolExecutor(1) as pool:
        put(a, HASHES)
        call = pool.submit(a.stub.Replicate, replicate_request(a, b, HASHES, transport="shm"), timeout=TIMEOUT)
        assert wait_until(lambda: stats(b).reserved_pages == len(HASHES), timeout=TIMEOUT)
        a.kill()
        with pytest.raises(grpc.RpcError):
            call.result(timeout=TIMEOUT)
        # No connection tells the target the source died: the reservation's lease (2 s) frees it.
        assert wait_until(lambda: stats(b).reserved_pages == 0, timeout=TIMEOUT)
        after = stats(b)
        assert after.used_pages == 0 and after.blocks_committed_total == 0
        assert present(b, HASHES) == [False] * len(HASHES)
