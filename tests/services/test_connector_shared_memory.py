"""The connector's same-host path (shared_client.SharedKVStore) against a real
kvstore server: it maps the pools, reads pinned pages, writes reserved ones
that commit checked, refuses a kvstore that shares nothing, and after the
kvstore restarts at the same address it never reads or writes the old
arenas (that call fails open, the next uses the new ones). The wire errors
of the shared-memory calls carry the right status codes."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.shared_client import SharedKVStore
from speckv.v1 import kvstore_pb2
from tests.support.kvstore_service import TIMEOUT, TINY, block_bytes, get, kvstore, put

G = TINY


def canonical(shared, medium, page):
    pool = shared.pool(medium)
    return b"".join(pool[layer, kv, page].tobytes() for layer in range(G.num_layers) for kv in range(2))


def opened(server, stub, counters=None):
    return SharedKVStore.open(stub, server.address, counters or Counters(), TIMEOUT, 10.0)


def test_reads_see_the_blocks_the_kvstore_holds_and_release_their_pins():
    with kvstore() as (server, stub):
        put(stub, 1, 2, 3)
        shared = opened(server, stub)
        assert shared is not None
        lease = shared.map_for_read([1, 2, 3])
        (medium, (positions, pages)), = lease.by_medium().items()
        assert positions == [0, 1, 2]
        assert [canonical(shared, medium, p) for p in pages] == [block_bytes(h) for h in (1, 2, 3)]
        assert stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).pinned_pages == 3
        shared.release(lease)
        assert stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).pinned_pages == 0
        shared.close()


def test_writes_into_reserved_pages_commit_checked_and_skip_present_blocks():
    with kvstore() as (server, stub):
        put(stub, 1)
        counters = Counters()
        shared = opened(server, stub, counters)
        slot = shared.reserve([1, 2, 3], None, "f")
        assert slot.positions == (1, 2)
        pool = shared.pool(slot.medium)
        for h, page in zip((2, 3), slot.pages):
            pool[:, :, page] = np.frombuffer(block_bytes(h), dtype=G.storage_dtype).reshape(
                G.num_layers, 2, G.block_size, G.num_kv_heads, G.head_dim)
        assert not stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=[2]), timeout=TIMEOUT).present[0]
        assert shared.commit(slot)
        assert [b.data for b in get(stub, 1, 2, 3)] == [block_bytes(h) for h in (1, 2, 3)]
        assert counters.blocks_saved_shared == 2 and counters.blocks_already_present == 1
        shared.close()


def test_a_kvstore_sharing_nothing_is_not_mapped():
    with kvstore(shared_memory=False) as (server, stub):
        assert opened(server, stub) is None


def test_after_a_restart_at_the_same_address_the_old_arenas_are_never_used():
    counters = Counters()
    with kvstore() as (server, stub):
        port = int(server.address.rpartition(":")[2])
        put(stub, 7)
        shared = opened(server, stub, counters)
        old_token = shared.pools.token("GPU")
    with kvstore(port=port) as (server, stub):
        put(stub, 8)
        shared._stub = stub  # the connector's channel reconnects to the address; a new stub stands for that
        assert shared.map_for_read([8]) is None  # the answer names a new arena: fail open, remap
        assert counters.shared_remaps == 1 and shared.pools.token("GPU") != old_token
        lease = shared.map_for_read([8])
        (medium, (_, pages)), = lease.by_medium().items()
        assert canonical(shared, medium, pages[0]) == block_bytes(8)
        shared.release(lease)
        assert stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).pinned_pages == 0
        shared.close()


@pytest.mark.parametrize("request_, code", [
    (kvstore_pb2.MapBlocksRequest(block_hashes=[1], lease_ms=0), grpc.StatusCode.INVALID_ARGUMENT),
    (kvstore_pb2.MapBlocksRequest(block_hashes=[1], lease_ms=10**9), grpc.StatusCode.INVALID_ARGUMENT),
    (kvstore_pb2.MapBlocksRequest(block_hashes=[1, 99], lease_ms=1000), grpc.StatusCode.NOT_FOUND),
    (kvstore_pb2.MapBlocksRequest(block_hashes=[], lease_ms=1000), grpc.StatusCode.INVALID_ARGUMENT),
])
def test_bad_map_requests_get_their_status_and_pin_nothing(request_, code):
    with kvstore() as (server, stub):
        put(stub, 1)
        with pytest.raises(grpc.RpcError) as failed:
            stub.MapBlocks(request_, timeout=TIMEOUT)
        assert failed.value.code() == code
        assert stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).pinned_pages == 0


def test_shared_memory_asked_of_a_private_tier_is_refused_and_frees_the_pages():
    with kvstore(shared_memory=False) as (server, stub):
        with pytest.raises(grpc.RpcError) as failed:
            stub.Reserve(kvstore_pb2.ReserveRequest(order_id="o", block_hashes=[1, 2], shared_memory=True),
                         timeout=TIMEOUT)
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).reserved_pages == 0


def test_a_shared_commit_with_wrong_checksums_publishes_nothing():
    with kvstore() as (server, stub):
        reply = stub.Reserve(kvstore_pb2.ReserveRequest(order_id="o", block_hashes=[5], shared_memory=True),
                             timeout=TIMEOUT)
        with pytest.raises(grpc.RpcError) as failed:
            stub.Commit(kvstore_pb2.CommitRequest(handle=reply.handle, chunk_crc32c={0: 123}, shared_memory=True),
                        timeout=TIMEOUT)
        assert failed.value.code() == grpc.StatusCode.ABORTED
        stats = stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
        assert stats.reserved_pages == 0 and stats.used_pages == 0


def test_a_lookup_pins_the_prefix_it_finds_and_falls_back_where_nothing_is_shared():
    from speckv.services.engine.vllm_connector.kvstore_client import KVStoreClient

    with kvstore() as (server, stub):
        put(stub, 1, 2, 3)
        client = KVStoreClient(server.address, Counters(), pin_at_lookup=True)
        lease = client.map_prefix([1, 2, 3, 4])
        assert lease.ids == (1, 2, 3) and len(lease.pages) == 3 and set(lease.tokens) == set(lease.media)
        assert stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).pinned_pages == 3
        client.release(lease)
        assert stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).pinned_pages == 0
        assert client.map_prefix([9]).ids == ()
        client.close()
    with kvstore(shared_memory=False) as (server, stub):
        put(stub, 1)
        client = KVStoreClient(server.address, Counters(), pin_at_lookup=True)
        assert client.map_prefix([1]) is None and client.prefix_blocks([1]) == 1
        assert client.map_prefix([1]) is None  # turned off: no second try
        client.close()
