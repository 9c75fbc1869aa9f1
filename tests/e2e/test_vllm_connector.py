"""SpeckvConnector on a real vLLM engine (the CPU build, the tiny random
Llama of loadgen/engines/tiny_llama.py) against a real kvstore server on
loopback. Each engine runs in its own child process
(loadgen/engines/vllm_runner.py), its prefix cache emptied before each prompt.

Asserted: a fresh engine that loads a prefix the first engine saved
generates exactly the greedy tokens of the recompute, through the kvstore's
shared memory (the default on one host) and over gRPC, and both paths save
the same bytes; a prefix replicated to a peer kvstore by an order (shared
memory or TCP) loads there with the same tokens; a request naming a peer in
its kv_transfer_params pulls the prefix into its own node's kvstore and
answers the same (a peer that is down costs a recompute); the scheduler, fed by the
kvstores' events, routes the prompt (its ids computed without an engine) to
the node holding it; the ids the kvstore
holds are vLLM's sha256 chain under the layout digest, computed here
without an engine; noise stored under those ids changes the output (the
loaded KV is really used); an engine of another model id never loads them;
an engine whose kvstore is down serves by recompute; blocks that fail their
crc32c are reported as load errors and recomputed. Nothing about times.
"""
from __future__ import annotations

import socket
from concurrent import futures
from pathlib import Path

import grpc

import numpy as np
import pytest

from speckv.services.engine.vllm_connector.identity import CPU_PAGE_LAYOUT as PAGE_LAYOUT, KVLayout, block_ids
from speckv.v1 import common_pb2, kvstore_pb2, kvstore_pb2_grpc, scheduler_pb2
from tests.support.kvstore_service import kvstore
from tests.support.scheduler_service import scheduler
from tests.support.waiting import wait_until
from speckv.loadgen.engines.tiny_llama import TinyLlama, tiny_llama
from speckv.loadgen.engines.vllm_runner import BLOCK_SIZE, engine_layout_digest, prompt_block_ids, run_engine
from speckv.services.common.vllm_block_ids import speckv_block_id

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = TinyLlama()
PROMPT_BLOCKS = 8
PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, SPEC.vocab, PROMPT_BLOCKS * BLOCK_SIZE + 10)]
KVSTORE = dict(geometry="tiny", block_size=BLOCK_SIZE, num_layers=SPEC.num_layers, num_kv_heads=SPEC.kv_heads,
               head_dim=SPEC.head_dim, dtype="float32", device_pages=256)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("models"), SPEC)


@pytest.fixture(scope="module")
def store():
    with kvstore(**KVSTORE) as (server, stub):
        yield server, stub


@pytest.fixture(scope="module")
def first(model, store, tmp_path_factory):
    """The first engine: recomputes the prompt and saves its blocks."""
    server, _ = store
    return run_engine({"model": str(model), "kvstore": server.address, "prompts": [PROMPT], "max_tokens": 16},
                      tmp_path_factory.mktemp("first"))


def vllm_chain_ids(model: Path, tokens: list[int]) -> list[int]:
    """The speckv ids of the prompt's full blocks, computed as the connector
    does but without an engine."""
    return prompt_block_ids(model, SPEC, tokens)


def test_the_first_engine_saves_each_full_block_once(first, store, model):
    counters = first["counters"]
    assert len(first["outputs"][0]) == 16
    assert counters["blocks_loaded"] == 0 and counters["save_failures"] == 0
    # 266 prompt + 15 fed generated tokens have KV: 8 full blocks
    assert counters["blocks_saved"] == PROMPT_BLOCKS
    _, stub = store
    ids = vllm_chain_ids(model, PROMPT)
    assert stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=ids), timeout=30).prefix_blocks == PROMPT_BLOCKS


def test_the_first_engine_saved_through_the_kvstores_shared_memory(first):
    assert first["counters"]["blocks_saved_shared"] == PROMPT_BLOCKS


@pytest.mark.parametrize("shared_memory", [True, False])
def test_a_fresh_engine_loads_the_prefix_and_generates_the_same_tokens(first, store, model, tmp_path, shared_memory):
    server, _ = store
    second = run_engine({"model": str(model), "kvstore": server.address, "prompts": [PROMPT], "max_tokens": 16,
                         "shared_memory": shared_memory}, tmp_path)
    assert second["counters"]["blocks_loaded"] == PROMPT_BLOCKS
    assert second["counters"]["blocks_loaded_shared"] == (PROMPT_BLOCKS if shared_memory else 0)
    assert second["counters"]["load_failures"] == 0
    assert second["outputs"] == first["outputs"]


@pytest.mark.parametrize("shared_memory", [True, False])
def test_layer_by_layer_loads_generate_the_same_tokens(first, store, model, tmp_path, shared_memory):
    """load_by_layer: the loads run beside the forward, each attention layer
    waiting for its own pages only."""
    server, _ = store
    layered = run_engine({"model": str(model), "kvstore": server.address, "prompts": [PROMPT], "max_tokens": 16,
                          "shared_memory": shared_memory, "load_by_layer": True}, tmp_path)
    assert layered["counters"]["blocks_loaded"] == PROMPT_BLOCKS and layered["counters"]["load_failures"] == 0
    assert layered["outputs"] == first["outputs"]


def test_an_engine_saving_over_grpc_stores_the_same_bytes(first, store, model, tmp_path):
    """The gRPC path (shared memory off) saves bytes equal to what the
    shared-memory path saved, block for block."""
    _, stub = store
    ids = vllm_chain_ids(model, PROMPT)
    saved = [m.data for m in stub.GetBlocks(kvstore_pb2.GetBlocksRequest(block_hashes=ids), timeout=30)]
    with kvstore(**KVSTORE) as (server, other_stub):
        over_grpc = run_engine({"model": str(model), "kvstore": server.address, "prompts": [PROMPT],
                                "max_tokens": 16, "shared_memory": False}, tmp_path)
        again = [m.data for m in other_stub.GetBlocks(kvstore_pb2.GetBlocksRequest(block_hashes=ids), timeout=30)]
    assert over_grpc["counters"]["blocks_saved"] == PROMPT_BLOCKS
    assert over_grpc["counters"]["blocks_saved_shared"] == 0
    assert again == saved


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_prefix_replicated_from_a_peer_loads_with_the_same_tokens(first, store, model, tmp_path, transport):
    """The order a scheduler issues (Replicate on the source kvstore) moves
    the prefix to a peer; an engine there loads it and answers the same."""
    _, source = store
    ids = vllm_chain_ids(model, PROMPT)
    with kvstore(**KVSTORE, node_id="node-1") as (peer, peer_stub):
        order = common_pb2.ReplicationOrder(order_id=f"peer-{transport}", block_hashes=ids, source_node="node-0",
                                            target_node="node-1", target_address=peer.address, family=str(ids[0]))
        reply = source.Replicate(kvstore_pb2.ReplicateRequest(order=order, transport=transport), timeout=60)
        assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == transport, reply.message
        assert peer_stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=ids), timeout=30).prefix_blocks == PROMPT_BLOCKS
        there = run_engine({"model": str(model), "kvstore": peer.address, "prompts": [PROMPT], "max_tokens": 16},
                           tmp_path)
    assert there["counters"]["blocks_loaded"] == PROMPT_BLOCKS and there["counters"]["load_failures"] == 0
    assert there["outputs"] == first["outputs"]


def test_the_scheduler_routes_the_returning_prompt_to_the_node_whose_kvstore_holds_it(first, store, model):
    """The ids a router computes for a prompt (vLLM's chain under the
    engine's layout digest, no engine needed) are the ids the connector
    saved: the scheduler, fed by the kvstores' events, routes the prompt to
    the node holding them. The blocks reach n2 by an order from the store the
    first engine saved into."""
    _, source = store
    ids = vllm_chain_ids(model, PROMPT)
    with scheduler() as (sched_server, sched), \
            kvstore(**KVSTORE, node_id="n1", scheduler=sched_server.address, heartbeat_interval_s=0.2) as (n1, _), \
            kvstore(**KVSTORE, node_id="n2", scheduler=sched_server.address, heartbeat_interval_s=0.2) as (n2, _):
        def blocks_of(node: str) -> int:
            state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=30)
            return next((n.num_blocks for n in state.nodes if n.node_id == node and n.alive), -1)
        assert wait_until(lambda: blocks_of("n1") == 0 and blocks_of("n2") == 0)
        order = common_pb2.ReplicationOrder(order_id="to-n2", block_hashes=ids, source_node="node-0",
                                            target_node="n2", target_address=n2.address, family=str(ids[0]))
        assert source.Replicate(kvstore_pb2.ReplicateRequest(order=order), timeout=60).state == \
            common_pb2.ORDER_STATE_COMMITTED
        assert wait_until(lambda: blocks_of("n2") == PROMPT_BLOCKS)
        reply = sched.Route(scheduler_pb2.RouteRequest(request_id="returning", block_hashes=ids,
                                                       prompt_tokens=len(PROMPT)), timeout=30)
    assert reply.node_id == "n2" and reply.cached_blocks == PROMPT_BLOCKS


def test_noise_under_the_same_ids_changes_the_output(first, model, tmp_path):
    ids = vllm_chain_ids(model, PROMPT)
    rng = np.random.default_rng(3)
    with kvstore(**KVSTORE) as (server, stub):
        bytes_per_block = 2 * SPEC.num_layers * BLOCK_SIZE * SPEC.kv_heads * SPEC.head_dim
        messages = [kvstore_pb2.PutBlockRequest(
            block_hash=h, data=rng.standard_normal(bytes_per_block, dtype=np.float32).tobytes(), family=str(ids[0]),
            parent_hash=ids[i - 1] if i else 0, has_parent=i > 0) for i, h in enumerate(ids)]
        assert stub.PutBlocks(iter(messages), timeout=30).stored == PROMPT_BLOCKS
        noisy = run_engine({"model": str(model), "kvstore": server.address, "prompts": [PROMPT],
                            "max_tokens": 16}, tmp_path)
    assert noisy["counters"]["blocks_loaded"] == PROMPT_BLOCKS
    assert noisy["outputs"] != first["outputs"]


def test_blocks_of_another_model_digest_are_never_loaded(first, store, model, tmp_path):
    server, _ = store
    other = run_engine({"model": str(model), "kvstore": server.address, "model_id": "another-model",
                        "prompts": [PROMPT], "max_tokens": 16}, tmp_path)
    assert other["counters"]["lookups"] >= 1
    assert other["counters"]["blocks_matched"] == 0 and other["counters"]["blocks_loaded"] == 0
    assert other["outputs"] == first["outputs"]  # the same weights, recomputed


def test_the_connector_stays_off_where_a_failed_load_would_fail_the_request(first, store, model, tmp_path):
    server, _ = store
    # vLLM's default kv_load_failure_policy "fail" ends a request whose load failed: speckv then loads nothing.
    failing = run_engine({"model": str(model), "kvstore": server.address, "load_failure_policy": "fail",
                          "prompts": [PROMPT], "max_tokens": 16}, tmp_path)
    assert failing["outputs"] == first["outputs"]
    assert failing["counters"]["lookups"] == 0 and failing["counters"]["blocks_loaded"] == 0


def test_a_kvstore_that_is_down_costs_a_recompute_not_a_request(first, model, tmp_path):
    address = f"127.0.0.1:{_closed_port()}"
    down = run_engine({"model": str(model), "kvstore": address, "prompts": [PROMPT], "max_tokens": 16}, tmp_path)
    assert down["outputs"] == first["outputs"]
    assert down["counters"]["lookup_failures"] >= 1 and down["counters"]["blocks_loaded"] == 0
    assert down["counters"]["save_failures"] >= 1


class CorruptKVStore(kvstore_pb2_grpc.KVStoreServicer):
    """Claims every block and serves each with a wrong crc32c."""

    def Lookup(self, request, context):
        n = len(request.block_hashes)
        return kvstore_pb2.LookupResponse(present=[True] * n, prefix_blocks=n)

    def GetBlocks(self, request, context):
        size = 2 * SPEC.num_layers * BLOCK_SIZE * SPEC.kv_heads * SPEC.head_dim * 4
        for h in request.block_hashes:
            yield kvstore_pb2.BlockData(block_hash=h, data=bytes(size), crc32c=12345)

    def PutBlocks(self, request_iterator, context):
        return kvstore_pb2.PutBlocksResponse(stored=sum(1 for _ in request_iterator))


@pytest.mark.parametrize("load_async, load_by_layer", [(False, False), (False, True), (True, False)])
def test_blocks_failing_their_checksum_are_recomputed_not_served(first, model, tmp_path, load_async, load_by_layer):
    """Loaded for the forward (whole or layer by layer), a failed block is a
    load error (vLLM recomputes it); loaded in the background, the request is
    reported failed (vLLM recomputes it from the start). Either way the
    engine answers."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_send_message_length", 64 << 20)])
    kvstore_pb2_grpc.add_KVStoreServicer_to_server(CorruptKVStore(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        corrupt = run_engine({"model": str(model), "kvstore": f"127.0.0.1:{port}", "prompts": [PROMPT],
                              "max_tokens": 16, "load_async": load_async, "load_by_layer": load_by_layer},
                             tmp_path)
    finally:
        server.stop(grace=None)
    assert corrupt["counters"]["blocks_matched"] == PROMPT_BLOCKS
    assert corrupt["counters"]["load_failures"] >= 1 and corrupt["counters"]["blocks_loaded"] == 0
    assert corrupt["counters"]["async_load_failures"] == (1 if load_async else 0)
    assert corrupt["outputs"] == first["outputs"]


def test_background_loads_give_the_same_tokens_locally_and_from_a_peer(first, store, model, tmp_path):
    """load_async: the engine parks the request while the connector loads
    its prefix beside the steps (from the node's kvstore, then for a second
    prompt pulled from a peer), and answers exactly as the recompute."""
    source_server, _ = store
    with kvstore(**KVSTORE, node_id="node-2") as (here, _):
        run = run_engine({"model": str(model), "kvstore": source_server.address, "prompts": [PROMPT],
                          "max_tokens": 16, "load_async": True}, tmp_path)
        pulled = run_engine({"model": str(model), "kvstore": here.address, "node_id": "node-2",
                             "peers": {"node-0": source_server.address}, "prompts": [PROMPT],
                             "pull_from_each": ["node-0"], "max_tokens": 16, "load_async": True}, tmp_path)
    assert run["counters"]["blocks_loaded"] == PROMPT_BLOCKS and run["counters"]["async_load_failures"] == 0
    assert pulled["counters"]["blocks_pulled"] == PROMPT_BLOCKS and pulled["counters"]["async_load_failures"] == 0
    assert run["outputs"] == pulled["outputs"] == first["outputs"]


def test_vllms_own_events_name_the_kvstores_blocks_under_the_layout_digest(first, store, model, tmp_path):
    """The engine's own KV events (vLLM's ZMQ publisher, decoded as the
    scheduler's --kv-events does) carry vLLM's ids; mapped through the
    engine's layout digest they are exactly the ids its connector saved in
    the kvstore, which a router computes without an engine."""
    _, stub = store
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = run_engine({"model": str(model), "kvstore": store[0].address, "prompts": [PROMPT], "max_tokens": 4,
                      "kv_events_port": port}, tmp_path)
    digest = engine_layout_digest(model, SPEC)
    mapped = [speckv_block_id(digest, h) for h in out["vllm_stored"]]
    ids = vllm_chain_ids(model, PROMPT)
    assert mapped[:PROMPT_BLOCKS] == ids
    assert set(out["vllm_stored"]).isdisjoint(ids)  # unmapped, vLLM's ids are not the kvstore's
    held = stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=mapped[:PROMPT_BLOCKS]), timeout=30)
    assert held.prefix_blocks == PROMPT_BLOCKS


def test_a_request_naming_a_peer_pulls_the_prefix_into_its_node_and_generates_the_same_tokens(first, store, model,
                                                                                               tmp_path):
    """A pull at request time (Route chose to fetch from a peer): the
    request's kv_transfer_params name the node holding the prefix; the
    connector has that peer's kvstore copy the blocks into its own node's
    kvstore and loads them from there, with the recompute's tokens. A
    second prompt naming a peer that is down costs a recompute, not the
    request."""
    source_server, _ = store
    ids = vllm_chain_ids(model, PROMPT)
    other = [int(t) for t in np.random.default_rng(8).integers(3, SPEC.vocab, 4 * BLOCK_SIZE + 3)]
    with kvstore(**KVSTORE, node_id="node-1") as (here, here_stub):
        assert here_stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=ids), timeout=30).prefix_blocks == 0
        run = run_engine({"model": str(model), "kvstore": here.address, "node_id": "node-1",
                          "peers": {"node-0": source_server.address, "node-9": f"127.0.0.1:{_closed_port()}"},
                          "prompts": [PROMPT, other], "pull_from_each": ["node-0", "node-9"],
                          "max_tokens_each": [16, 4]}, tmp_path)
        held = here_stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=ids), timeout=30).prefix_blocks
    counters = run["counters"]
    assert counters["blocks_pulled"] == PROMPT_BLOCKS and counters["pull_failures"] == 0
    assert counters["load_failures"] == 0
    assert held == PROMPT_BLOCKS  # the pull left the prefix on this node
    assert run["outputs"][0] == first["outputs"][0]
    assert len(run["outputs"][1]) == 4 and counters["peer_lookup_failures"] >= 1  # node-9 down: recomputed


def _closed_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
