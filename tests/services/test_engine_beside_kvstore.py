"""One node, two sources: a real kvstore registers node n1 with a real
scheduler and streams its tiers, while n1's engine publishes vLLM's KV
events on real ZMQ sockets (`--kv-events n1=...,kvstore=1`). Neither source
undoes the other: the engine dropping a block its kvstore holds leaves it
routable, the engine's own blocks are routed to (past the kvstore's
Lookup), and they are indexed again when the kvstore restarts and
re-registers."""
from __future__ import annotations

import pytest
import zmq

from speckv.v1 import scheduler_pb2
from tests.services.test_scheduler_kvstore import CHAIN, kvstore, nodes, put_chain
from tests.support.scheduler_service import scheduler
from tests.support.vllm_events import FakeVllm, map_batch, map_stored
from tests.support.waiting import TIMEOUT, wait_until

TINY_BLOCK = 4  # the "tiny" profile's and geometry's tokens per block
ENGINE_ONLY = [2001, 2002, 2003]


def route(sched, hashes):
    return sched.Route(scheduler_pb2.RouteRequest(request_id="r", block_hashes=list(hashes),
                                                  prompt_tokens=TINY_BLOCK * (len(hashes) + 1)), timeout=TIMEOUT)


def removed(hashes) -> dict:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU"}


@pytest.fixture
def engine():
    context = zmq.Context()
    publisher = FakeVllm(context, replay=True)
    yield publisher
    publisher.close()
    context.term()


def test_the_engine_and_its_kvstore_feed_one_node_without_undoing_each_other(engine):
    spec = f"n1={engine.endpoint},replay={engine.replay_endpoint},kvstore=1"
    with scheduler(kv_events=spec, heartbeat_interval_ms=200) as (server, sched):
        engine.wait_subscribed()
        engine.publish(map_batch(map_stored(ENGINE_ONLY, block_size=TINY_BLOCK)))
        assert "n1" not in nodes(sched)  # the engine's feed registers nothing: the kvstore will
        with kvstore("n1", server.address) as (_, kv1):
            assert wait_until(lambda: "n1" in nodes(sched) and nodes(sched)["n1"].num_blocks == 3)
            assert put_chain(kv1, CHAIN).stored == len(CHAIN)
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 3 + len(CHAIN))

            # The engine evicts the chain's first block from its cache; the kvstore's device pool still holds it.
            engine.publish(map_batch(removed(CHAIN[:1] + ENGINE_ONLY[:1])))
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 2 + len(CHAIN))
            assert route(sched, CHAIN).cached_blocks == len(CHAIN)
            # The kvstore's Lookup knows nothing of the engine's cache: the node holds the longer prefix.
            engine.publish(map_batch(map_stored(ENGINE_ONLY[:1], block_size=TINY_BLOCK)))
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 3 + len(CHAIN))
            reply = route(sched, ENGINE_ONLY)
            assert (reply.node_id, reply.cached_blocks) == ("n1", 3)

        # The kvstore restarts empty (a new process, a new registration): the engine's blocks come back.
        with kvstore("n1", server.address):
            assert wait_until(lambda: nodes(sched)["n1"].alive and nodes(sched)["n1"].num_blocks == 3)
            assert route(sched, ENGINE_ONLY).cached_blocks == 3
