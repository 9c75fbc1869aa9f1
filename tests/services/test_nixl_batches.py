"""NIXL batches checked as they land, on real in-process kvstores: a
replication over nixl is cut into batches of --nixl-batch-kib, each checked
by the target as its note arrives (the speckv.kvstore.nixl.batches gauge
counts them), so the commit reads nothing back; a writer whose batch lands
damaged (its bytes differ from its note's crc32c) gets its reservation
aborted, pages freed, nothing visible. Skipped where NIXL is not installed."""
from __future__ import annotations

import grpc
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from speckv.services.common.geometry import preset
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.nixl.agent import NixlAgent
from speckv.services.kvstore.nixl.batch_note import batch_crcs, notes_for
from speckv.services.kvstore.nixl.layout import PoolRegion, write_batches
from speckv.services.kvstore.nixl.loader import NixlLoader
from speckv.v1 import common_pb2, kvstore_pb2
from tests.support.kvstore_service import block_bytes, get, kvstore, make_store, put, writes
from tests.support.waiting import TIMEOUT

API = NixlLoader().api()
pytestmark = pytest.mark.skipif(API is None, reason="NIXL is not installed")
TINY = preset("tiny", 256)  # 32 KiB blocks
PER_BATCH = 8  # in 256 KiB batches
NIXL = {"nixl": True, "nixl_batch_kib": 256, "block_size": 256}


def batches_gauge(reader: InMemoryMetricReader) -> dict[str, float]:
    data = reader.get_metrics_data()
    return {p.attributes["outcome"]: p.value for rm in (data.resource_metrics if data else ())
            for scope in rm.scope_metrics for m in scope.metrics if m.name == "speckv.kvstore.nixl.batches"
            for p in m.data.data_points}


def test_a_replication_over_nixl_is_checked_batch_by_batch():
    reader = InMemoryMetricReader()
    telemetry = build_telemetry("kvstore", {}, metric_readers=(reader,))
    hashes = list(range(101, 101 + 2 * PER_BATCH + 3))
    with kvstore(node_id="src", **NIXL) as (_, src), \
            kvstore(node_id="dst", shared_memory=False, telemetry=telemetry, **NIXL) as (dst_server, dst):
        assert dst.NixlMetadata(kvstore_pb2.NixlMetadataRequest(), timeout=TIMEOUT).batch_notes
        put(src, *hashes, geometry=TINY)
        order = common_pb2.ReplicationOrder(order_id="o-1", family="f", block_hashes=hashes, source_node="src",
                                            target_node="dst", target_address=dst_server.address)
        reply = src.Replicate(kvstore_pb2.ReplicateRequest(order=order, transport="nixl"), timeout=TIMEOUT)
        assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == "nixl", reply.message
        assert [b.data for b in get(dst, *hashes)] == [block_bytes(h, TINY) for h in hashes]
        assert batches_gauge(reader) == {"checked": 3, "refused": 0}


def test_a_batch_damaged_on_its_way_aborts_the_reservation():
    """The test is the writer: it reserves with nixl, writes two batches
    with their notes by NIXL, the second's bytes changed after its crc32c
    was taken; the target refuses that batch as it lands."""
    reader = InMemoryMetricReader()
    telemetry = build_telemetry("kvstore", {}, metric_readers=(reader,))
    hashes = list(range(201, 201 + 2 * PER_BATCH))
    source = make_store(64, "writer", geometry=TINY)
    source.put_blocks(writes(*hashes, geometry=TINY))
    tier, source_pages = source.pages_of(hashes)
    pool, segment_crcs = source.copy_source(tier, source_pages)
    agent = NixlAgent(API, "writer", {"GPU": source.host_pools()[Tier.DEVICE]}, TINY)
    try:
        with kvstore(node_id="dst", shared_memory=False, telemetry=telemetry, **NIXL) as (_, dst):
            metadata = dst.NixlMetadata(kvstore_pb2.NixlMetadataRequest(), timeout=TIMEOUT)
            remote = agent.load_remote(metadata.metadata)
            (target_pool,) = metadata.pools
            grant = dst.Reserve(kvstore_pb2.ReserveRequest(order_id="o-2", block_hashes=hashes, nixl=True),
                                timeout=TIMEOUT)
            target = PoolRegion(target_pool.address, target_pool.num_pages, TINY.num_layers, TINY.segment_bytes)
            batches = write_batches(agent.region_of(pool), target, source_pages, list(grant.pages), PER_BATCH)
            crcs = batch_crcs(batches, segment_crcs, TINY.bytes_per_block, TINY.segment_bytes)
            pool[TINY.num_layers - 1, 1, source_pages[-1]].view("uint8")[-1] ^= 0x5A  # damaged after its crc
            agent.write(remote, batches, float("inf"), notes=notes_for(grant.handle, batches, crcs,
                                                                       TINY.bytes_per_block))
            commit = kvstore_pb2.CommitRequest(handle=grant.handle, chunk_crc32c=crcs, shared_memory=True,
                                               nixl_batches=True)
            with pytest.raises(grpc.RpcError) as refused:
                dst.Commit(commit, timeout=TIMEOUT)
            assert refused.value.code() == grpc.StatusCode.ABORTED, refused.value.details()
            assert batches_gauge(reader) == {"checked": 1, "refused": 1}
            assert dst.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).reserved_pages == 0
            assert not any(dst.Lookup(kvstore_pb2.LookupRequest(block_hashes=hashes), timeout=TIMEOUT).present)
    finally:
        agent.close()
