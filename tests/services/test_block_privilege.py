"""Least privilege on a node's blocks (issue 43, item 3), on a real kvstore
serving mutual TLS: only that node's engine (spiffe://speckv/engine/<node>)
or the admin may PutBlocks, GetBlocks and MapBlocks; another node's
certificate, another node's engine and a service are refused with
PERMISSION_DENIED and change nothing. The engine's connector saves through
shared memory under the data plane's protection (its Reserve and Commit
carry the capability and its secret) and reads what it saved."""
from __future__ import annotations

import contextlib

import grpc
import numpy as np
import pytest

from speckv.services.cluster.certs import make_bundle
from speckv.services.common.rpc.server import open_channel
from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.kvstore_client import KVStoreClient
from speckv.services.engine.vllm_connector.shared_client import SharedKVStore
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc
from tests.support.kvstore_service import TIMEOUT, TINY, block_bytes, get, kvstore, put

DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    certs = make_bundle(tmp_path_factory.mktemp("tls"), ["node-0", "node-1"])
    files = certs.node("node-0")
    with kvstore(node_id="node-0", tls_cert=files.cert, tls_key=files.key, tls_ca=files.ca) as (server, _), \
            contextlib.ExitStack() as stack:
        def stub(who) -> kvstore_pb2_grpc.KVStoreStub:
            channel = stack.enter_context(open_channel(server.address, None, tls=who.load(), peer_role="kvstore"))
            return kvstore_pb2_grpc.KVStoreStub(channel)
        yield certs, server, stub


def attempts(stub):
    return {
        "PutBlocks": lambda: put(stub, 900),
        "GetBlocks": lambda: get(stub, 1),
        "MapBlocks": lambda: stub.MapBlocks(kvstore_pb2.MapBlocksRequest(block_hashes=[1], lease_ms=1000),
                                            timeout=TIMEOUT),
        # A save in the engine's name would publish its blocks as computed here (STORED), not as a replica.
        "Reserve with engine_save": lambda: stub.Reserve(kvstore_pb2.ReserveRequest(
            order_id="forged-save", block_hashes=[901], lease_ms=1000, engine_save=True), timeout=TIMEOUT),
    }


def test_the_nodes_engine_and_the_admin_read_and_write_its_blocks(node):
    certs, _, stub = node
    engine, admin = stub(certs.engine("node-0")), stub(certs.admin)
    assert put(engine, 1, 2).stored == 2 and put(admin, 3).stored == 1
    assert [b.data for b in get(engine, 1, 2, 3)] == [block_bytes(h) for h in (1, 2, 3)]
    assert [b.data for b in get(admin, 1)] == [block_bytes(1)]
    engine.MapBlocks(kvstore_pb2.MapBlocksRequest(block_hashes=[1], lease_ms=1000), timeout=TIMEOUT)
    engine.Unpin(kvstore_pb2.PinRequest(block_hashes=[1]), timeout=TIMEOUT)


@pytest.mark.parametrize("who", ["node-1", "engine of node-1", "node-0 itself", "scheduler"])
def test_anyone_else_is_refused_and_changes_nothing(node, who):
    certs, _, stub = node
    files = {"node-1": certs.node("node-1"), "engine of node-1": certs.engine("node-1"),
             "node-0 itself": certs.node("node-0"), "scheduler": certs.service("scheduler")}[who]
    caller, admin = stub(files), stub(certs.admin)
    put(admin, 1)
    before = admin.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
    for what, call in attempts(caller).items():
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == DENIED, (who, what)
    after = admin.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
    assert (after.used_pages, after.pinned_pages, after.blocks_stored_total) == \
        (before.used_pages, before.pinned_pages, before.blocks_stored_total)
    assert not admin.Lookup(kvstore_pb2.LookupRequest(block_hashes=[900]), timeout=TIMEOUT).present[0]


def test_the_engine_saves_through_shared_memory_under_protection(node):
    certs, server, stub = node
    client = KVStoreClient(server.address, Counters(), tls=certs.engine("node-0").load())
    shared = SharedKVStore.open(client.stub, server.address, Counters(), TIMEOUT, 10.0)
    assert shared is not None
    slot = shared.reserve([7001, 7002], None, "f")
    assert slot.capability and slot.secret  # TLS: the node protects its reservations
    pool = shared.pool(slot.medium)
    g = TINY
    for h, page in zip((7001, 7002), slot.pages):
        pool[:, :, page] = np.frombuffer(block_bytes(h), dtype=g.storage_dtype).reshape(
            g.num_layers, 2, g.block_size, g.num_kv_heads, g.head_dim)
    assert shared.commit(slot)
    assert [b.data for b in get(stub(certs.engine("node-0")), 7001, 7002)] == [block_bytes(7001), block_bytes(7002)]
    other = stub(certs.engine("node-1"))
    with pytest.raises(grpc.RpcError) as refused:
        other.Reserve(kvstore_pb2.ReserveRequest(order_id="o-e1", block_hashes=[7003], shared_memory=True),
                      timeout=TIMEOUT)
    assert refused.value.code() == DENIED  # another node's engine writes nothing here
    shared.close()
    client.close()
