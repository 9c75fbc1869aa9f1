"""The scheduler in front of a vLLM fleet, no speckv kvstore anywhere: real
ZMQ sockets bound here stand in for two engines' KV event publishers (vLLM's
frames, its msgpack schema, its replay protocol), and Route must pick the
engine that holds a prompt's prefix.

Engine A publishes msgspec structs as "type"-tagged maps with int hashes and
has a replay (ROUTER) socket; engine B publishes positional arrays of a
release before tiers (no `medium`) with bytes hashes and has none."""
from __future__ import annotations

import hashlib
import time

import msgpack
import pytest
import zmq
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from speckv.services.common.clock import SystemClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.scheduler.adapters.vllm_subscriber import VllmEventFeeds, VllmNodeSpec
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.ports import SchedulerSettings
from speckv.v1 import scheduler_pb2
from tests.support.scheduler_service import scheduler
from tests.support.vllm_events import FakeVllm, map_batch, map_stored
from tests.support.waiting import TIMEOUT, wait_until

BLOCK = 16  # llama-3-8b-h100's block size, and vLLM's default --block-size
MASK = (1 << 64) - 1


def array_batch(*events) -> bytes:  # array_like=True: [ts, events], tags first in each event
    return msgpack.packb([time.time(), list(events)], use_bin_type=True)


def array_stored(hashes, parent=None) -> list:  # a release before tiers: no trailing medium
    return ["BlockStored", hashes, parent, list(range(BLOCK * len(hashes))), BLOCK, None]


def chain_ints(seed: int, n: int) -> list[int]:
    return [(seed * 1_000_003 + i) & MASK for i in range(n)]


def chain_bytes(seed: int, n: int) -> list[bytes]:
    return [hashlib.sha256(b"%d/%d" % (seed, i)).digest() for i in range(n)]


def ids(hashes: list[bytes]) -> list[int]:
    """What a router sends for bytes hashes: their low 64 bits, big-endian."""
    return [int.from_bytes(h, "big") & MASK for h in hashes]


# --- the scheduler side -------------------------------------------------------

def nodes(sched):
    state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    return {n.node_id: n for n in state.nodes}


def blocks(sched, node_id: str) -> int:
    return nodes(sched)[node_id].num_blocks


def route(sched, hashes: list[int]):
    # An engine-side reporter tells the scheduler both queues are empty, as it
    # would for kvstore-backed engines (the KV event stream carries no load).
    for node_id in ("vllm-a", "vllm-b"):
        sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id=node_id, queued_tokens=0, num_waiting_requests=0),
                        timeout=TIMEOUT)
    return sched.Route(scheduler_pb2.RouteRequest(request_id="r", block_hashes=hashes,
                                                  prompt_tokens=BLOCK * (len(hashes) + 1)), timeout=TIMEOUT)


def metric(reader: InMemoryMetricReader, name: str) -> dict[tuple, float]:
    data = reader.get_metrics_data()
    points = {}
    for resource_metrics in data.resource_metrics if data else ():
        for scope in resource_metrics.scope_metrics:
            for m in scope.metrics:
                if m.name == name:
                    for p in m.data.data_points:
                        points[tuple(sorted(p.attributes.items()))] = p.value
    return points


@pytest.fixture
def zmq_context():
    context = zmq.Context()
    yield context
    context.term()


def test_route_picks_the_vllm_engine_holding_the_prefix(zmq_context):
    a, b = FakeVllm(zmq_context, replay=True), FakeVllm(zmq_context, replay=False)
    reader = InMemoryMetricReader()
    spec = (f"vllm-a={a.endpoint},replay={a.replay_endpoint},address=127.0.0.1:18000;"
            f"vllm-b={b.endpoint},address=127.0.0.1:18001")
    try:
        with scheduler(engine_profile="llama-3-8b-h100", kv_events=spec, heartbeat_interval_ms=200,
                       telemetry=build_telemetry("scheduler", {}, metric_readers=(reader,))) as (_, sched):
            a.wait_subscribed()
            b.wait_subscribed()
            assert wait_until(lambda: {k for k, n in nodes(sched).items() if n.alive} == {"vllm-a", "vllm-b"})
            assert set(nodes(sched)) == {"vllm-a", "vllm-b"}  # no kvstore registered, none runs

            x, y = chain_ints(1, 3), chain_bytes(2, 3)
            a.publish(map_batch(map_stored(x[:2]), map_stored(x[2:], parent=x[1])))
            b.publish(array_batch(array_stored(y)))
            assert wait_until(lambda: blocks(sched, "vllm-a") == 3 and blocks(sched, "vllm-b") == 3)
            reply = route(sched, x)
            assert (reply.node_id, reply.address, reply.cached_blocks) == ("vllm-a", "127.0.0.1:18000", 3)
            reply = route(sched, ids(y))
            assert (reply.node_id, reply.address, reply.cached_blocks) == ("vllm-b", "127.0.0.1:18001", 3)

            # A loses a batch: the next one shows the gap, the replay socket fills it.
            z = chain_ints(3, 4)
            a.publish(map_batch(map_stored(z)), send=False)
            a.publish(map_batch({"type": "BlockRemoved", "block_hashes": [x[2]], "medium": "GPU"}))
            assert wait_until(lambda: blocks(sched, "vllm-a") == 2 + 4)
            assert a.replay_requests == [1]
            assert (route(sched, z).node_id, route(sched, z).cached_blocks) == ("vllm-a", 4)
            assert route(sched, x).cached_blocks == 2

            # B loses a batch and has no replay socket: its inventory resets, the feed carries on.
            w, v = chain_bytes(4, 2), chain_bytes(5, 5)
            b.publish(array_batch(array_stored(w)), send=False)
            b.publish(array_batch(array_stored(v)))
            assert wait_until(lambda: blocks(sched, "vllm-b") == 5)
            assert route(sched, ids(y)).cached_blocks == 0
            assert (route(sched, ids(v)).node_id, route(sched, ids(v)).cached_blocks) == ("vllm-b", 5)

            # Bad input is counted, never fatal: frames, garbage, another block size.
            a.send_raw([b"", b"\x00"])
            a.publish(b"\xc1 not msgpack")
            a.publish(map_batch(map_stored(chain_ints(6, 2), block_size=32)))
            u = chain_ints(7, 2)
            a.publish(map_batch(map_stored(u)))
            assert wait_until(lambda: blocks(sched, "vllm-a") == 6 + 2)
            skipped = metric(reader, "speckv.scheduler.vllm_events_skipped")
            assert {dict(k)["reason"]: n for k, n in skipped.items() if dict(k)["node"] == "vllm-a"} == \
                {"bad_frames": 1, "garbage": 1, "block_size": 1}
            catch_ups = {(dict(k)["node"], dict(k)["outcome"]): n
                         for k, n in metric(reader, "speckv.scheduler.vllm_catch_ups").items()}
            assert catch_ups[("vllm-a", "replayed")] == 1 and catch_ups[("vllm-b", "reset")] >= 2

            # B's engine restarts on the same port: sequences begin again at 0, old blocks are gone.
            port = b.port
            b.close()
            b = FakeVllm(zmq_context, replay=False, port=port)
            b.wait_subscribed()
            fresh = chain_bytes(8, 3)
            b.publish(array_batch(array_stored(fresh)))
            assert wait_until(lambda: blocks(sched, "vllm-b") == 3)
            assert route(sched, ids(v)).cached_blocks == 0
            assert (route(sched, ids(fresh)).node_id, route(sched, ids(fresh)).cached_blocks) == ("vllm-b", 3)
            assert nodes(sched)["vllm-b"].alive
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("failure", ["silent", "trimmed"])
def test_a_failed_catch_up_resets_the_node_and_the_feed_carries_on(zmq_context, failure):
    """The feed against a real core: a replay socket that never answers, or
    whose buffer no longer holds the missed batch, leaves the node reset and
    then indexed from what is known for sure."""
    engine = FakeVllm(zmq_context, replay=True, answer=failure != "silent")
    core = SchedulerCore(SchedulerSettings(), SystemClock(), get_profile("llama-3-8b-h100"))
    feeds = VllmEventFeeds([VllmNodeSpec("vllm-c", engine.endpoint, engine.replay_endpoint, "127.0.0.1:18002")],
                           core, BLOCK, heartbeat_interval_s=0.2, replay_timeout_s=1.0)
    feeds.start()
    held = lambda: {r.view.node_id: r.view.num_blocks for r in core.cluster_state().nodes}.get("vllm-c")  # noqa: E731
    try:
        engine.wait_subscribed()
        old, lost, after, later = chain_ints(9, 4), chain_ints(10, 2), chain_ints(11, 2), chain_ints(12, 1)
        engine.publish(map_batch(map_stored(old)))
        assert wait_until(lambda: held() == 4)
        engine.publish(map_batch(map_stored(lost)), send=False)
        engine.publish(map_batch(map_stored(after)), send=False)
        if failure == "trimmed":
            with engine._lock:
                del engine.buffer[1]  # vLLM's replay buffer moved past sequence 1
        engine.publish(map_batch(map_stored(later)))
        # silent: nothing recovered, only the live batch; trimmed: the replayed tail (2) before it
        expected = 1 if failure == "silent" else 2 + 1
        assert wait_until(lambda: held() == expected)
        assert engine.replay_requests == [1]
        stats = feeds.stats()["vllm-c"]
        assert (stats.replays, stats.resets) == (0, 2)  # the fresh start and this one
        engine.publish(map_batch(map_stored(chain_ints(13, 2))))
        assert wait_until(lambda: held() == expected + 2)  # and it carries on, in sequence
    finally:
        feeds.stop()
        engine.close()
