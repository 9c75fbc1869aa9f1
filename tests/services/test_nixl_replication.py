"""Two real kvstore processes replicating with NIXL (services/kvstore/nixl):
byte-identical copies, `auto` picks shared memory on one host and nixl where
the target shares nothing, nixl missing gives tcp with one line; over TLS
only a node or the admin gets the agent's metadata. A kill -9 of either end
mid-transfer: test_kvstore_processes.py, parametrized over tcp, shm and nixl.
Skipped where NIXL is not installed (make .venv/.installed-nixl)."""
from __future__ import annotations

import os

import grpc
import pytest

from speckv.services.cluster.certs import make_bundle
from speckv.services.common.rpc.server import open_channel
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.kvstore.nixl.loader import MODULES, NixlLoader
from speckv.services.kvstore.server import build_server as build_kvstore
from speckv.v1 import common_pb2, kvstore_pb2, kvstore_pb2_grpc
from speckv.loadgen.bench.transfer.procs import start_kvstore
from tests.support.kvstore_procs import (
    GEOMETRY_ARGS,
    TIMEOUT,
    block,
    blocks_of,
    processes,
    put,
    replicate_request,
    stats,
)

pytestmark = pytest.mark.skipif(NixlLoader().api() is None, reason="NIXL is not installed (make .venv/.installed-nixl)")

PER_CHUNK = 8  # 32 KiB blocks in a 256 KiB NIXL batch: one transfer, noted and checked as it lands
# An agent is off by default (config.py: registering the pools is slow); batches of PER_CHUNK blocks.
WITH_NIXL = ["--nixl", "--nixl-batch-kib", "256"]
HASHES = list(range(1, 301))
NIXL = "nixl"


@pytest.fixture(scope="module")
def pair():
    with processes(("a", WITH_NIXL), ("b", WITH_NIXL)) as (a, b):
        yield a, b


@pytest.mark.parametrize("count", [1, PER_CHUNK - 1, PER_CHUNK, PER_CHUNK + 1, 100])
def test_nixl_replicates_byte_for_byte(pair, count):
    a, b = pair
    hashes = list(range(1000 * count, 1000 * count + count))
    put(a, hashes)
    reply = a.stub.Replicate(replicate_request(a, b, hashes, transport=NIXL, chunk_bytes=256 * 1024,
                                               order_id=f"o{count}"), timeout=TIMEOUT)
    assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == NIXL, reply.message
    assert reply.blocks_sent == count and reply.bytes_sent == count * len(block(0))
    assert blocks_of(b, hashes) == [block(h) for h in hashes]
    assert stats(b).reserved_pages == 0 and stats(a).pinned_pages == 0


def test_blocks_the_target_holds_are_not_sent_again_and_an_empty_reservation_commits(pair):
    a, b = pair
    hashes = [50_001, 50_002]
    put(a, hashes)
    put(b, hashes[:1])
    reply = a.stub.Replicate(replicate_request(a, b, hashes, transport=NIXL, order_id="skip"), timeout=TIMEOUT)
    assert reply.transport == NIXL and reply.blocks_sent == 1 and reply.blocks_skipped == 1
    assert blocks_of(b, hashes) == [block(h) for h in hashes]
    reply = a.stub.Replicate(replicate_request(a, b, hashes, transport=NIXL, order_id="none-left"), timeout=TIMEOUT)
    assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.blocks_sent == 0


def test_metadata_names_the_agent_and_its_registered_pools(pair):
    _, b = pair
    reply = b.stub.NixlMetadata(kvstore_pb2.NixlMetadataRequest(), timeout=TIMEOUT)
    assert reply.agent_name.startswith("speckv-b-") and reply.metadata
    assert [(p.medium, p.num_pages, p.size) for p in reply.pools] == [("GPU", stats(b).num_pages, stats(b).pool_bytes)]


def test_a_reservation_for_nixl_names_its_pages_and_the_agent(pair):
    _, b = pair
    agent = b.stub.NixlMetadata(kvstore_pb2.NixlMetadataRequest(), timeout=TIMEOUT).agent_name
    grant = b.stub.Reserve(kvstore_pb2.ReserveRequest(order_id="r", block_hashes=[70_001, 70_002], nixl=True),
                           timeout=TIMEOUT)
    try:
        assert len(grant.pages) == 2 and grant.pages_medium == "GPU" and grant.pages_token == agent
    finally:
        b.stub.Abort(kvstore_pb2.AbortRequest(handle=grant.handle, reason="test"), timeout=TIMEOUT)
    assert stats(b).reserved_pages == 0


def test_auto_is_shared_memory_on_one_host_and_nixl_to_a_target_sharing_nothing():
    with processes(("a", WITH_NIXL), ("b", WITH_NIXL), ("c", ["--no-shared-memory", *WITH_NIXL])) as (a, b, c):
        put(a, HASHES[:20])
        to_b = a.stub.Replicate(replicate_request(a, b, HASHES[:20]), timeout=TIMEOUT)  # a's default: auto
        to_c = a.stub.Replicate(replicate_request(a, c, HASHES[:20]), timeout=TIMEOUT)
        assert (to_b.transport, to_c.transport) == ("shm", NIXL)
        assert blocks_of(b, HASHES[:20]) == blocks_of(c, HASHES[:20]) == [block(h) for h in HASHES[:20]]


def test_a_target_without_nixl_gets_tcp():
    with processes(("a", WITH_NIXL), ("c", ["--no-shared-memory", "--no-nixl"])) as (a, c):
        put(a, HASHES[:5])
        reply = a.stub.Replicate(replicate_request(a, c, HASHES[:5], transport=NIXL), timeout=TIMEOUT)
        assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == "tcp"
        with pytest.raises(grpc.RpcError) as refused:
            c.stub.NixlMetadata(kvstore_pb2.NixlMetadataRequest(), timeout=TIMEOUT)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert blocks_of(c, HASHES[:5]) == [block(h) for h in HASHES[:5]]


def test_nixl_missing_gives_tcp_and_one_line(tmp_path):
    """The real import failure: packages that raise ImportError shadow the
    installed NIXL in the source's path (the target has NIXL)."""
    for name in {m.split(".")[0] for m in MODULES}:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('no NIXL here (test)')\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    a = start_kvstore("a", [*GEOMETRY_ARGS, *WITH_NIXL], environ={"PYTHONPATH": path})
    try:
        with processes(("c", ["--no-shared-memory", *WITH_NIXL])) as (c,):
            put(a, HASHES[:5])
            for order in ("m1", "m2"):
                reply = a.stub.Replicate(replicate_request(a, c, HASHES[:5], order_id=order), timeout=TIMEOUT)
                assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == "tcp", reply.message
            assert blocks_of(c, HASHES[:5]) == [block(h) for h in HASHES[:5]]
        log = a.log_path.read_text(errors="replace")
    finally:
        a.stop()
    assert log.count("NIXL unavailable") == 1 and "no NIXL here (test)" in log, log[-2000:]


def test_over_tls_only_a_node_or_the_admin_gets_the_metadata(tmp_path):
    """The metadata holds the remote keys of the whole pools: a service's
    certificate (here the scheduler's) is refused, a node's and the admin's
    are answered."""
    certs = make_bundle(tmp_path, ["node-a", "node-b"])
    files = certs.node("node-b")
    config = KVStoreConfig(node_id="node-b", device_pages=16, nixl=True, tls_cert=files.cert, tls_key=files.key,
                           tls_ca=files.ca)
    config.validate()
    node = build_kvstore(config, build_telemetry("kvstore", {})).start()
    try:
        for who, expected in ((certs.service("scheduler"), grpc.StatusCode.PERMISSION_DENIED),
                              (certs.node("node-a"), None), (certs.admin, None)):
            with open_channel(node.address, None, tls=who.load(), peer_role="kvstore") as channel:
                call = kvstore_pb2_grpc.KVStoreStub(channel).NixlMetadata
                if expected is None:
                    assert call(kvstore_pb2.NixlMetadataRequest(), timeout=TIMEOUT).agent_name.startswith("speckv-")
                    continue
                with pytest.raises(grpc.RpcError) as refused:
                    call(kvstore_pb2.NixlMetadataRequest(), timeout=TIMEOUT)
                assert refused.value.code() == expected
    finally:
        node.stop(grace_s=1.0)
