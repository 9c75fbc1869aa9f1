"""The torch engine on two real kvstore servers: a prefix computed on node A,
replicated to node B by the real Replicate RPC (reserve, bulk data plane,
commit), serves B's requests with exactly A's tokens."""
from __future__ import annotations

import pytest

from speckv.loadgen.engines.torch_engine import build_torch_engines
from speckv.loadgen.engines.torch_kv import GrpcBlockStore, chain_hashes
from speckv.v1 import common_pb2, kvstore_pb2, kvstore_pb2_grpc
from tests.support.torch_engine_helpers import (
    BLOCK,
    GEOMETRY,
    SPEC,
    TIMEOUT,
    core_store,
    engine,
    job,
    model_kvstore,
    prompt,
    run,
)


@pytest.fixture(scope="module")
def cluster():
    with model_kvstore("a") as (server_a, channel_a), model_kvstore("b") as (server_b, channel_b):
        yield {"a": (server_a, channel_a), "b": (server_b, channel_b)}


def replicate(cluster, hashes, order_id: str) -> kvstore_pb2.ReplicateResponse:
    order = common_pb2.ReplicationOrder(order_id=order_id, family="doc", block_hashes=list(hashes),
                                        source_node="a", target_node="b",
                                        target_address=cluster["b"][0].address, lease_ms=60_000)
    stub = kvstore_pb2_grpc.KVStoreStub(cluster["a"][1])
    return stub.Replicate(kvstore_pb2.ReplicateRequest(order=order), timeout=TIMEOUT)


def test_kvstores_run_the_model_geometry(cluster):
    stats = kvstore_pb2_grpc.KVStoreStub(cluster["b"][1]).GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
    assert stats.geometry.bytes_per_block == GEOMETRY.bytes_per_block and stats.geometry.dtype == "float32"


def test_replicated_prefix_gives_the_tokens_of_the_computing_node(cluster):
    store_a, store_b = GrpcBlockStore(cluster["a"][1]), GrpcBlockStore(cluster["b"][1])
    node_a, node_b = engine(store_a, "a"), engine(store_b, "b")
    document = prompt(21, 8 * BLOCK + 5)
    on_a = job("a-1", document, 12, family="doc")
    run(node_a, on_a)
    assert (on_a.computed_tokens, on_a.stored_blocks) == (len(document), 8)

    hashes = chain_hashes(document, BLOCK, SPEC.fingerprint())
    reply = replicate(cluster, hashes, "ord-torch-1")
    assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.blocks_sent == 8
    assert reply.bytes_sent == 8 * GEOMETRY.bytes_per_block

    # B never computed this document: it reads A's replicated KV and computes only the tail.
    on_b = job("b-1", document, 12, family="doc")
    run(node_b, on_b)
    assert (on_b.reused_blocks, on_b.computed_tokens, on_b.stored_blocks) == (8, 5, 0)
    assert on_b.output_ids == on_a.output_ids

    # And both equal a full recompute on a node that never saw the document.
    _, fresh = core_store("fresh")
    full = job("full-1", document, 12)
    run(engine(fresh, "fresh"), full)
    assert full.computed_tokens == len(document) and full.output_ids == on_a.output_ids

    # A follow-up turn (the document plus a question) on B reuses the prefix too.
    question = prompt(22, len(document) + 2 * BLOCK + 3, prefix=document)
    turn_b, turn_full = job("b-2", question, 6), job("full-2", question, 6)
    run(node_b, turn_b)
    run(engine(core_store("fresh2")[1], "fresh2"), turn_full)
    assert (turn_b.reused_blocks, turn_b.computed_tokens) == (8, len(question) - 8 * BLOCK)
    assert turn_b.output_ids == turn_full.output_ids


def test_kv_bytes_are_bit_exact_across_compute_replicate_and_recompute(cluster):
    store_a, store_b = GrpcBlockStore(cluster["a"][1]), GrpcBlockStore(cluster["b"][1])
    document = prompt(31, 4 * BLOCK + 2)
    run(engine(store_a, "a"), job("a-bits", document, 1))
    hashes = chain_hashes(document, BLOCK, SPEC.fingerprint())
    assert replicate(cluster, hashes, "ord-torch-2").state == common_pb2.ORDER_STATE_COMMITTED
    _, fresh = core_store("bits")
    run(engine(fresh, "bits"), job("full-bits", document, 1))
    on_a, on_b, recomputed = store_a.get(hashes), store_b.get(hashes), fresh.get(hashes)
    assert len(on_b) == 4 and all(len(d) == GEOMETRY.bytes_per_block for d in on_b)
    assert on_b == on_a == recomputed


def test_engines_built_for_a_cluster_pull_from_each_other(cluster):
    engines = build_torch_engines({n: c for n, (_, c) in cluster.items()}, SPEC, BLOCK)
    assert sorted(engines) == ["a", "b"] and engines["a"].model.spec == SPEC
    document = prompt(41, 5 * BLOCK + 9)
    origin = job("pull-origin", document, 5)
    run(engines["a"], origin)
    pulled = job("pull-b", document, 5, fetch_from="a")
    run(engines["b"], pulled)
    assert (pulled.reused_blocks, pulled.fetched_blocks, pulled.computed_tokens) == (0, 5, 9)
    assert pulled.stored_blocks == 5 and pulled.output_ids == origin.output_ids
    assert GrpcBlockStore(cluster["b"][1]).prefix_blocks(chain_hashes(document, BLOCK, SPEC.fingerprint())) == 5
