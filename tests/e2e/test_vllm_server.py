"""A real vLLM OpenAI API server (the CPU build, the tiny random Llama) with
SpeckvConnector onto a real kvstore on loopback, driven as a router drives
it: streamed token-id completions. Asserted: the first completion's full
blocks reach the kvstore under the ids computed without an engine; after
the engine's own prefix cache is emptied, the same prompt is answered with
the same tokens and its prefix is read from the kvstore's shared memory
(MapBlocks is called); a time to first token is measured for each. A
completion whose kv_transfer_params name a peer pulls the prefix from that
peer's kvstore with the same tokens. Nothing about times."""
from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from speckv.loadgen.engines.openai_stream import stream_completion
from speckv.loadgen.engines.tiny_llama import TinyLlama, tiny_llama
from speckv.loadgen.engines.vllm_runner import BLOCK_SIZE, engine_layout_digest, prompt_block_ids
from speckv.loadgen.engines.vllm_server import pull_params
from speckv.services.cluster.vllm_servers import (
    VllmServerSpec, reset_prefix_cache, start_server, stop_server, wait_healthy)
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.v1 import common_pb2, kvstore_pb2, scheduler_pb2
from tests.support.kvstore_service import kvstore
from tests.support.scheduler_service import scheduler
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = TinyLlama()
PROMPT_BLOCKS = 8
PROMPT = [int(t) for t in np.random.default_rng(17).integers(3, SPEC.vocab, PROMPT_BLOCKS * BLOCK_SIZE + 10)]
KVSTORE = dict(geometry="tiny", block_size=BLOCK_SIZE, num_layers=SPEC.num_layers, num_kv_heads=SPEC.kv_heads,
               head_dim=SPEC.head_dim, dtype="float32", device_pages=256)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serving(spec: VllmServerSpec, log_dir: Path) -> Iterator[None]:
    """The server running and healthy for the block; stopped after it."""
    log = log_dir / f"{spec.name}.log"
    server = start_server(spec, log, os.environ)
    try:
        wait_healthy(spec, server, log)
        yield
    finally:
        stop_server(server)


def test_a_server_streams_saves_and_answers_a_returning_prompt_from_the_kvstore(tmp_path):
    model = tiny_llama(tmp_path / "models", SPEC)
    spans = InMemorySpanExporter()
    telemetry = build_telemetry("kvstore", {}, span_processors=(SimpleSpanProcessor(spans),))
    with kvstore(telemetry=telemetry, **KVSTORE) as (store, stub):
        spec = VllmServerSpec("vllm-0", str(model), free_port(), store.address, max_model_len=2048)
        with serving(spec, tmp_path):
            first = stream_completion(spec.url, spec.served_model_name, PROMPT, 16)
            ids = prompt_block_ids(model, SPEC, PROMPT)
            assert stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=ids), timeout=30).prefix_blocks == PROMPT_BLOCKS
            spans.clear()
            reset_prefix_cache(spec)
            again = stream_completion(spec.url, spec.served_model_name, PROMPT, 16)
    assert len(first.token_ids) == 16 and again.token_ids == first.token_ids
    assert 0 < first.ttft_s <= first.total_s and 0 < again.ttft_s <= again.total_s
    assert any(s.name.endswith("KVStore/MapBlocks") for s in spans.get_finished_spans())


def test_a_request_naming_a_peer_in_kv_transfer_params_pulls_the_prefix_through_the_api(tmp_path):
    """Route chose to fetch from another node: the router names it in the
    completion's kv_transfer_params. The server's kvstore (node-1) has lost
    the prefix (evicted by other blocks) while node-0's kvstore holds it; the
    answer is the recompute's, and the pull left the prefix on node-1."""
    model = tiny_llama(tmp_path / "models", SPEC)
    with kvstore(**{**KVSTORE, "device_pages": 64}, node_id="node-1") as (here, here_stub), \
            kvstore(**KVSTORE, node_id="node-0") as (there, there_stub):
        spec = VllmServerSpec("vllm-1", str(model), free_port(), here.address, max_model_len=2048,
                              node_id="node-1", peers=(("node-0", there.address),))
        with serving(spec, tmp_path):
            first = stream_completion(spec.url, spec.served_model_name, PROMPT, 16)
            ids = prompt_block_ids(model, SPEC, PROMPT)
            order = common_pb2.ReplicationOrder(order_id="to-node-0", block_hashes=ids, source_node="node-1",
                                                target_node="node-0", target_address=there.address,
                                                family=str(ids[0]))
            assert here_stub.Replicate(kvstore_pb2.ReplicateRequest(order=order), timeout=60).state \
                == common_pb2.ORDER_STATE_COMMITTED
            _evict_with_other_blocks(here_stub, pages=64)
            assert here_stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=ids), timeout=30).prefix_blocks == 0
            reset_prefix_cache(spec)
            pulled = stream_completion(spec.url, spec.served_model_name, PROMPT, 16,
                                       kv_transfer_params=pull_params("node-0"))
            held = here_stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=ids), timeout=30).prefix_blocks
    assert pulled.token_ids == first.token_ids
    assert held == PROMPT_BLOCKS  # copied here by the pull (the engine's own saves skip what it loaded)
    assert pulled.cached_tokens == PROMPT_BLOCKS * BLOCK_SIZE  # vLLM computed only the tail


def test_the_scheduler_indexes_the_engines_own_cache_beside_its_kvstore(tmp_path):
    """--kv-events node-0=...,kvstore=1: the engine's own KV events are the
    node's second source. After the kvstore has lost the prompt (evicted by
    other blocks), Route still finds it in the engine's prefix cache; once
    that cache is emptied too, in neither."""
    model = tiny_llama(tmp_path / "models", SPEC)
    events = free_port()
    feeds = f"node-0=tcp://127.0.0.1:{events},digest={engine_layout_digest(model, SPEC).hex()},kvstore=1"
    with scheduler(engine_profile="tiny-llama-vllm-cpu", kv_events=feeds) as (scheduling, sched), \
            kvstore(**{**KVSTORE, "device_pages": 64}, node_id="node-0", scheduler=scheduling.address,
                    heartbeat_interval_s=0.2) as (store, stub):
        spec = VllmServerSpec("vllm-0", str(model), free_port(), store.address, max_model_len=2048,
                              kv_events_endpoint=f"tcp://*:{events}")
        with serving(spec, tmp_path):
            stream_completion(spec.url, spec.served_model_name, PROMPT, 16)
            ids = prompt_block_ids(model, SPEC, PROMPT)

            def cached() -> int:
                request = scheduler_pb2.RouteRequest(request_id="r", block_hashes=ids, prompt_tokens=len(PROMPT))
                return sched.Route(request, timeout=30).cached_blocks

            assert wait_until(lambda: cached() == PROMPT_BLOCKS)
            _evict_with_other_blocks(stub, pages=64)
            assert stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=ids), timeout=30).prefix_blocks == 0
            assert cached() == PROMPT_BLOCKS  # the engine's cache still holds it
            reset_prefix_cache(spec)
            # vLLM publishes the clearing with its next step's events: give it a step.
            stream_completion(spec.url, spec.served_model_name, PROMPT[::-1][:BLOCK_SIZE + 1], 1)
            assert wait_until(lambda: cached() == 0)


def test_a_dead_engine_leaves_the_index_and_its_kvstores_blocks_stay(tmp_path):
    """--kv-events node-0=...,kvstore=1,health=URL: once the engine's server
    is stopped, its /health refuses and the engine's own blocks leave the
    index, while the node (its kvstore live) keeps its kvstore's blocks."""
    model = tiny_llama(tmp_path / "models", SPEC)
    events, port = free_port(), free_port()
    feeds = (f"node-0=tcp://127.0.0.1:{events},digest={engine_layout_digest(model, SPEC).hex()},kvstore=1,"
             f"health=http://127.0.0.1:{port}/health")
    with scheduler(engine_profile="tiny-llama-vllm-cpu", kv_events=feeds) as (scheduling, sched), \
            kvstore(**{**KVSTORE, "device_pages": 64}, node_id="node-0", scheduler=scheduling.address,
                    heartbeat_interval_s=0.2) as (store, stub):
        spec = VllmServerSpec("vllm-0", str(model), port, store.address, max_model_len=2048,
                              kv_events_endpoint=f"tcp://*:{events}")
        ids = prompt_block_ids(model, SPEC, PROMPT)

        def cached() -> int:
            request = scheduler_pb2.RouteRequest(request_id="r", block_hashes=ids, prompt_tokens=len(PROMPT))
            return sched.Route(request, timeout=30).cached_blocks

        def node() -> scheduler_pb2.NodeState:
            state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=30)
            return {n.node_id: n for n in state.nodes}["node-0"]

        with serving(spec, tmp_path):
            stream_completion(spec.url, spec.served_model_name, PROMPT, 16)
            assert wait_until(lambda: cached() == PROMPT_BLOCKS)
            _evict_with_other_blocks(stub, pages=64)  # the prompt is now in the engine's cache alone
            assert stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=ids), timeout=30).prefix_blocks == 0
            assert cached() == PROMPT_BLOCKS
        assert wait_until(lambda: cached() == 0, timeout=60)  # the server stopped: the engine is dead
        assert node().alive and node().num_blocks == 64  # the kvstore's blocks stay


def _evict_with_other_blocks(stub, pages: int) -> None:
    """Fills the kvstore's pages with unrelated blocks (their bytes of the
    right size), so the least recently used, the prompt's, are evicted."""
    stats = stub.GetStats(kvstore_pb2.StatsRequest(), timeout=30)
    size = stats.geometry.bytes_per_block if stats.geometry.bytes_per_block else None
    assert size, stats.geometry
    messages = (kvstore_pb2.PutBlockRequest(block_hash=900_000 + i, data=bytes([i % 251]) * size, family="filler")
                for i in range(pages))
    stub.PutBlocks(messages, timeout=60)
