"""vLLM's KV event publisher sends no heartbeat, so an engine is probed at
its OpenAI server's /health (`--kv-events ...,health=URL`). A real scheduler,
a real kvstore, vLLM's frames on real ZMQ sockets and a real HTTP health
endpoint that the test stops or turns to 503 (vLLM's answer once its engine
is dead):
- beside a live kvstore, the dead engine's blocks leave the index and its
  kvstore's stay; the restarted engine comes back empty and its events
  repopulate it;
- an engine-only node goes down at once (no heartbeat timeout), and is
  registered again, empty, when the engine answers again;
- a false alarm (the same engine answers again) costs a replay from its
  replay socket (vLLM 0.32's frames), not its blocks."""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import zmq
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from speckv.services.common.rpc.telemetry import build_telemetry
from tests.services.test_engine_beside_kvstore import ENGINE_ONLY, TINY_BLOCK, route
from tests.services.test_scheduler_kvstore import CHAIN, kvstore, nodes, put_chain
from tests.services.test_vllm_kv_events import metric
from tests.support.scheduler_service import scheduler
from tests.support.vllm_events import FakeVllm, map_batch, map_stored
from tests.support.waiting import TIMEOUT, wait_until

FAST_PROBES = {"engine_health_interval_s": 0.1, "engine_health_timeout_s": 1.0, "engine_health_failures": 2}


class HealthEndpoint:
    """GET /health answers `status` (vLLM's OpenAI server: 200, or 503 once its engine is dead)."""

    def __init__(self) -> None:
        self.status, self.port = 200, 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/health"

    def start(self) -> "HealthEndpoint":
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.send_response(endpoint.status if self.path == "/health" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        deadline = time.monotonic() + TIMEOUT
        while True:  # the same port again after a stop (the URL the scheduler was given)
            try:
                self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@pytest.fixture
def health():
    endpoint = HealthEndpoint().start()
    yield endpoint
    endpoint.stop()


@pytest.fixture
def zmq_context():
    context = zmq.Context()
    yield context
    context.term()


def test_a_dead_engine_beside_a_live_kvstore_leaves_the_index_and_comes_back_empty(zmq_context, health):
    engine = FakeVllm(zmq_context, replay=False)
    reader = InMemoryMetricReader()
    spec = f"n1={engine.endpoint},kvstore=1,health={health.url}"
    try:
        with scheduler(kv_events=spec, heartbeat_interval_ms=200, **FAST_PROBES,
                       telemetry=build_telemetry("scheduler", {}, metric_readers=(reader,))) as (server, sched), \
                kvstore("n1", server.address) as (_, kv1):
            engine.wait_subscribed()
            engine.publish(map_batch(map_stored(ENGINE_ONLY, block_size=TINY_BLOCK)))
            assert wait_until(lambda: "n1" in nodes(sched))
            assert put_chain(kv1, CHAIN).stored == len(CHAIN)
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 3 + len(CHAIN))
            assert route(sched, ENGINE_ONLY).cached_blocks == 3

            health.stop()  # the engine's server is gone; its kvstore lives on and keeps the node up
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == len(CHAIN))
            assert nodes(sched)["n1"].alive
            assert route(sched, ENGINE_ONLY).cached_blocks == 0
            assert route(sched, CHAIN).cached_blocks == len(CHAIN)
            engine.publish(map_batch(map_stored([2009], block_size=TINY_BLOCK)))  # what a dying engine still says
            assert wait_until(lambda: metric(reader, "speckv.scheduler.vllm_events_skipped").get(
                (("node", "n1"), ("reason", "engine_dead"))) == 1)

            # The engine restarts empty: a new publisher on the same port, its sequences from 0.
            engine.close()
            engine = FakeVllm(zmq_context, replay=False, port=engine.port)
            health.start()
            engine.wait_subscribed()
            assert wait_until(lambda: metric(reader, "speckv.scheduler.vllm_engine_health").get(
                (("node", "n1"), ("transition", "revived"))) == 1)
            assert nodes(sched)["n1"].num_blocks == len(CHAIN)  # back empty: none of its old blocks return
            engine.publish(map_batch(map_stored(ENGINE_ONLY[:1], block_size=TINY_BLOCK)))
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 1 + len(CHAIN))
            assert route(sched, ENGINE_ONLY).cached_blocks == 1
            assert metric(reader, "speckv.scheduler.vllm_engine_health")[(("node", "n1"), ("transition", "died"))] == 1
    finally:
        engine.close()


def test_an_engine_only_node_goes_down_when_its_engine_answers_503_and_returns_empty(zmq_context, health):
    engine = FakeVllm(zmq_context, replay=False)
    spec = f"vllm-a={engine.endpoint},address=127.0.0.1:18000,health={health.url}"
    try:
        # node_timeout_s far beyond the test: the node goes down from the probe, not from missed heartbeats.
        with scheduler(kv_events=spec, heartbeat_interval_ms=200, node_timeout_s=600.0, **FAST_PROBES) as (_, sched):
            engine.wait_subscribed()
            engine.publish(map_batch(map_stored([3001, 3002], block_size=TINY_BLOCK)))
            assert wait_until(lambda: "vllm-a" in nodes(sched) and nodes(sched)["vllm-a"].num_blocks == 2)
            assert nodes(sched)["vllm-a"].alive

            health.status = 503
            assert wait_until(lambda: not nodes(sched)["vllm-a"].alive)
            assert nodes(sched)["vllm-a"].num_blocks == 0

            health.status = 200  # the same process answers again: registered anew, empty
            assert wait_until(lambda: nodes(sched)["vllm-a"].alive)
            assert nodes(sched)["vllm-a"].num_blocks == 0
            engine.publish(map_batch(map_stored([3003], block_size=TINY_BLOCK)))
            assert wait_until(lambda: nodes(sched)["vllm-a"].num_blocks == 1)
            reply = route(sched, [3003])
            assert (reply.node_id, reply.cached_blocks) == ("vllm-a", 1)
    finally:
        engine.close()


def test_a_false_alarm_costs_a_replay_not_the_blocks(zmq_context, health):
    engine = FakeVllm(zmq_context, replay=True, replay_topic=True)  # vLLM 0.32 replays with the topic frame
    spec = f"vllm-a={engine.endpoint},replay={engine.replay_endpoint},address=127.0.0.1:18000,health={health.url}"
    try:
        with scheduler(kv_events=spec, heartbeat_interval_ms=200, node_timeout_s=600.0, **FAST_PROBES) as (_, sched):
            engine.wait_subscribed()
            engine.publish(map_batch(map_stored([3001, 3002], block_size=TINY_BLOCK)))
            assert wait_until(lambda: "vllm-a" in nodes(sched) and nodes(sched)["vllm-a"].num_blocks == 2)
            health.status = 503
            assert wait_until(lambda: not nodes(sched)["vllm-a"].alive)
            health.status = 200
            assert wait_until(lambda: nodes(sched)["vllm-a"].alive)
            # The engine never died: its next batch starts a fresh subscription, replayed from 0.
            engine.publish(map_batch(map_stored([3003], parent=3002, block_size=TINY_BLOCK)))
            assert wait_until(lambda: nodes(sched)["vllm-a"].num_blocks == 3)
            assert engine.replay_requests == [0]
            assert route(sched, [3001, 3002, 3003]).cached_blocks == 3
    finally:
        engine.close()


def test_an_engine_that_answers_after_it_was_taken_for_dead_has_its_first_batch_indexed(zmq_context, health):
    # A starting engine: its server does not answer yet, so the prober declares it dead; the prober's next
    # round is far away (60 s), so only the feed's own probe at the batch can take the batch in.
    engine = FakeVllm(zmq_context, replay=False)
    reader = InMemoryMetricReader()
    slow_rounds = {"engine_health_interval_s": 60.0, "engine_health_timeout_s": 1.0, "engine_health_failures": 1}
    health.status = 503
    spec = f"n1={engine.endpoint},kvstore=1,health={health.url}"
    try:
        with scheduler(kv_events=spec, heartbeat_interval_ms=200, **slow_rounds,
                       telemetry=build_telemetry("scheduler", {}, metric_readers=(reader,))) as (server, sched), \
                kvstore("n1", server.address) as (_, kv1):
            engine.wait_subscribed()
            assert wait_until(lambda: metric(reader, "speckv.scheduler.vllm_engine_health").get(
                (("node", "n1"), ("transition", "died"))) == 1)
            assert put_chain(kv1, CHAIN).stored == len(CHAIN)
            health.status = 200  # the server is up now; the prober will not look again for a minute
            engine.publish(map_batch(map_stored(ENGINE_ONLY, block_size=TINY_BLOCK)))
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 3 + len(CHAIN))
            assert route(sched, ENGINE_ONLY).cached_blocks == 3
    finally:
        engine.close()
