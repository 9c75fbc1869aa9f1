"""Two real kvstore processes on one host replicating through shared memory
(services/kvstore/shm_target.py): byte-identical copies, auto picks it and
falls back to TCP where the target shares nothing. A kill -9 of either end
mid-copy: test_kvstore_processes.py, parametrized over tcp and shm."""
from __future__ import annotations

import pytest

from speckv.v1 import common_pb2
from tests.support.kvstore_procs import (
    TIMEOUT,
    block,
    blocks_of,
    processes,
    put,
    replicate_request,
    stats,
)

PER_CHUNK = 8  # 32 KiB blocks in the 256 KiB chunks asked below
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
