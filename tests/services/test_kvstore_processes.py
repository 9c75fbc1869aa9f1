"""Two real kvstore processes replicating over the TCP data plane and the
gRPC fallback, and what survives when either is SIGKILLed mid-transfer (over
TCP, over shared memory and with NIXL; their own cases:
test_shm_replication.py, test_nixl_replication.py)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from speckv.loadgen.bench.transfer.procs import start_kvstore
from speckv.services.kvstore.nixl.loader import NixlLoader
from speckv.v1 import common_pb2
from tests.support.kvstore_procs import (
    GEOMETRY_ARGS,
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

HASHES = list(range(1, 301))  # 300 blocks of 32 KiB: 9.4 MiB
# Each transport's kill cases; nixl's kvstores start an agent (off by default) and need NIXL installed.
TRANSPORTS = ["tcp", "shm", pytest.param("nixl", marks=pytest.mark.skipif(
    NixlLoader().api() is None, reason="NIXL is not installed (make .venv/.installed-nixl)"))]
AGENT = {"tcp": [], "shm": [], "nixl": ["--nixl"]}
SLOW = ["--link-gbps", "0.04"]  # 5 MB/s: the 9.4 MiB take ~2 s, long enough to kill in the middle


@pytest.mark.parametrize("transport, chunk_kib", [("tcp", 256), ("tcp", 1024), ("grpc", 1024)])
def test_two_processes_replicate_hundreds_of_blocks_byte_for_byte(transport, chunk_kib):
    with processes(("a", []), ("b", [])) as (a, b):
        put(a, HASHES)
        reply = a.stub.Replicate(replicate_request(a, b, HASHES, transport=transport, chunk_bytes=chunk_kib * 1024),
                                 timeout=TIMEOUT)
        assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == transport
        assert reply.blocks_sent == len(HASHES) and reply.bytes_sent == len(HASHES) * len(block(1))
        assert blocks_of(b, HASHES) == [block(h) for h in HASHES]
        assert stats(b).reserved_pages == 0 and stats(a).pinned_pages == 0


def test_target_without_data_plane_gets_the_grpc_fallback():
    with processes(("a", []), ("b", ["--transport", "grpc", "--no-shared-memory", "--no-nixl"])) as (a, b):
        put(a, HASHES[:20])
        # a's default, auto: b shares no memory (else shm would carry it), has no NIXL agent (else nixl) and
        # no data plane
        reply = a.stub.Replicate(replicate_request(a, b, HASHES[:20]), timeout=TIMEOUT)
        assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == "grpc"
        assert blocks_of(b, HASHES[:20]) == [block(h) for h in HASHES[:20]]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_target_killed_mid_transfer_fails_the_order_and_leaves_the_source_intact(transport):
    with processes(("a", [*SLOW, *AGENT[transport]]), ("b", AGENT[transport])) as (a, b), \
            ThreadPoolExecutor(1) as pool:
        put(a, HASHES)
        call = pool.submit(a.stub.Replicate, replicate_request(a, b, HASHES, transport=transport), timeout=TIMEOUT)
        assert wait_until(lambda: stats(b).reserved_pages == len(HASHES), timeout=TIMEOUT)
        b.kill()
        with pytest.raises(grpc.RpcError) as failed:
            call.result(timeout=TIMEOUT)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value.details()
        after = stats(a)
        assert after.pinned_pages == 0 and after.used_pages == len(HASHES)
        assert blocks_of(a, HASHES) == [block(h) for h in HASHES]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_source_killed_mid_transfer_publishes_nothing_and_frees_the_reservation(transport):
    with processes(("a", [*SLOW, *AGENT[transport]]), ("b", ["--reservation-lease-s", "3", *AGENT[transport]])) \
            as (a, b), ThreadPoolExecutor(1) as pool:
        put(a, HASHES)
        call = pool.submit(a.stub.Replicate, replicate_request(a, b, HASHES, transport=transport), timeout=TIMEOUT)
        assert wait_until(lambda: stats(b).reserved_pages == len(HASHES), timeout=TIMEOUT)
        a.kill()
        with pytest.raises(grpc.RpcError):
            call.result(timeout=TIMEOUT)
        # tcp: the dropped connection aborts the reservation at once; shm and nixl (no
        # connection to drop) and otherwise: its lease (3 s) frees it. Freed, nothing published.
        assert wait_until(lambda: stats(b).reserved_pages == 0, timeout=TIMEOUT)
        after = stats(b)
        assert after.used_pages == 0 and after.blocks_committed_total == 0
        assert present(b, HASHES) == [False] * len(HASHES)


def test_stop_removes_the_log_directory_it_made_and_keeps_a_callers(tmp_path):
    made = start_kvstore("own", GEOMETRY_ARGS)
    given = start_kvstore("given", GEOMETRY_ARGS, log_dir=tmp_path)
    try:
        assert made.log_path.exists() and made.owned_dir == made.log_path.parent
        assert given.owned_dir is None and given.log_path.parent == tmp_path
    finally:
        made.stop()
        given.stop()
    assert not made.log_path.parent.exists()
    assert given.log_path.exists()
