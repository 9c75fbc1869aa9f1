"""The routing client (services/client/routing.py) against real services on
loopback: routes come from the scheduler while it answers; with the
scheduler stopped every route still gets a node (the fallback), the breaker
opens, and the fallback's arrivals reach the predictor; once a scheduler
serves on the same port again, routing returns to it."""
from __future__ import annotations

import contextlib
import socket
import time
from typing import Iterator

import grpc
import pytest

from speckv.services.client.breaker import BreakerSettings, BreakerState
from speckv.services.client.fallback import rendezvous_order
from speckv.services.client.routing import SCHEDULER_CHANNEL_OPTIONS, ClientSettings, RouteSource, RoutingClient
from speckv.services.common.errors import Unavailable
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server as build_predictor
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.server import build_server as build_scheduler
from speckv.v1 import scheduler_pb2_grpc
from tests.support.scheduler_service import register
from tests.support.waiting import wait_until

NODES = {"n1": "127.0.0.1:1", "n2": "127.0.0.1:2", "n3": "127.0.0.1:3"}
OPEN_S = 0.5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def scheduler_on(port: int, state_dir: str) -> Iterator[scheduler_pb2_grpc.SchedulerStub]:
    config = SchedulerConfig(engine_profile="tiny", tick_s=0.05, port=port, state_dir=state_dir, node_timeout_s=60.0)
    server = build_scheduler(config, build_telemetry("scheduler", {})).start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield scheduler_pb2_grpc.SchedulerStub(channel)
    finally:
        channel.close()
        server.stop(grace_s=0.0)


@contextlib.contextmanager
def predictor_server() -> Iterator[str]:
    config = PredictorConfig(port=0, grace_s=0.5)
    config.validate()
    server = build_predictor(config, build_telemetry("predictor", {})).start()
    try:
        yield server.address
    finally:
        server.stop(grace_s=0.5)


def route(client: RoutingClient, i: int, first: int = 7_000):
    routed = client.route(f"r{i}", [first, first + 1 + i], 40, family="f")
    client.done(f"r{i}")
    return routed


def test_the_client_falls_back_while_the_scheduler_is_down_and_returns_to_it(tmp_path):
    port, state = free_port(), str(tmp_path / "state")
    settings = ClientSettings(deadline_s=2.0, breaker=BreakerSettings(failures_to_open=2, open_s=OPEN_S))
    with predictor_server() as predictor_address, \
            grpc.insecure_channel(f"127.0.0.1:{port}", options=SCHEDULER_CHANNEL_OPTIONS) as channel, \
            grpc.insecure_channel(predictor_address) as predictor:
        client = RoutingClient(channel, predictor=predictor, settings=settings)
        with scheduler_on(port, state) as stub:
            for node, address in NODES.items():
                register(stub, node, address)
            answers = [route(client, i) for i in range(5)]
            assert {a.source for a in answers} == {RouteSource.SCHEDULER}
            assert all(a.node_id in NODES and a.address == NODES[a.node_id] for a in answers)
            assert client.counters().routes_scheduler == 5

        # Down: every route still gets a node, the one rendezvous hashing ranks first for the prefix.
        down = [route(client, 10 + i) for i in range(6)]
        assert {a.source for a in down} == {RouteSource.FALLBACK}
        assert {a.node_id for a in down} == {rendezvous_order(7_000, NODES)[0]}
        assert all(a.address == NODES[a.node_id] for a in down)  # learned from the scheduler's answers
        counters = client.counters()
        assert counters.routes_fallback == 6 and counters.breaker_opens == 1
        assert counters.scheduler_errors == 2  # the breaker opened after two; the rest never asked
        assert set(counters.errors_by_code) == {"UNAVAILABLE"}
        assert client.breaker_state is BreakerState.OPEN
        assert wait_until(lambda: client.counters().arrivals.sent == 6)  # the fallback's arrivals, reported

        # Back on the same port: a probe after open_s closes the breaker; routing returns to the scheduler.
        with scheduler_on(port, state) as stub:
            for node, address in NODES.items():
                register(stub, node, address)
            assert wait_until(lambda: route(client, 100 + int(time.monotonic() * 1e3)).source
                              is RouteSource.SCHEDULER, timeout=10.0)
            assert client.breaker_state is BreakerState.CLOSED
            back = [route(client, 200 + i) for i in range(5)]
            assert {a.source for a in back} == {RouteSource.SCHEDULER}
        client.close()
        final = client.counters()
        assert final.routes == final.routes_scheduler + final.routes_fallback
        assert final.arrivals.sent == final.routes_fallback and final.arrivals.dropped == 0


def test_a_route_the_scheduler_refuses_falls_back_without_opening_the_breaker(tmp_path):
    port = free_port()
    settings = ClientSettings(breaker=BreakerSettings(failures_to_open=1, open_s=60.0))
    with scheduler_on(port, str(tmp_path / "state")) as stub, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        register(stub, "n1", NODES["n1"])
        client = RoutingClient(channel, nodes={"n1": NODES["n1"]}, settings=settings)
        refused = client.route("bad", [1], prompt_tokens=-1 & 0xFFFFFFFF, family="x" * 100_000)
        assert refused.source is RouteSource.FALLBACK and refused.node_id == "n1"
        assert client.counters().errors_by_code == {"INVALID_ARGUMENT": 1}
        assert client.breaker_state is BreakerState.CLOSED
        assert client.route("good", [1], 40, family="f").source is RouteSource.SCHEDULER
        client.close()


def test_a_client_that_knows_no_node_says_so(tmp_path):
    with grpc.insecure_channel(f"127.0.0.1:{free_port()}") as channel:  # nothing listens there
        client = RoutingClient(channel, settings=ClientSettings(deadline_s=1.0))
        with pytest.raises(Unavailable, match="knows no node that is up"):
            client.route("r", [1], 40)
        client.add_node("n1", NODES["n1"])
        client.mark_down("n1")
        with pytest.raises(Unavailable, match="knows no node that is up"):
            client.route("r", [1], 40)
        client.mark_up("n1")
        assert client.route("r", [1], 40).node_id == "n1"
        client.add_node("n2", NODES["n2"])
        client.moved("r", "n2", 40)  # the router ran r on n2: n2 carries its load, n1 none
        assert client.route("s", [], 40).node_id == "n1"  # no blocks: the least loaded
        client.done("r")
        client.done("s")
        assert client.route("t", [], 40).node_id == "n1"  # both idle again: ties by node id
        client.close()


def test_a_request_no_proto_can_carry_still_gets_a_node(tmp_path):
    """A negative token count, a hash outside uint64, a family with a lone surrogate: never sent, never
    raised; the fallback places it (its arrival dropped and counted where it cannot be encoded)."""
    port = free_port()
    with predictor_server() as predictor_address, scheduler_on(port, str(tmp_path / "state")) as stub, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel, \
            grpc.insecure_channel(predictor_address) as predictor:
        register(stub, "n1", NODES["n1"])
        client = RoutingClient(channel, nodes={"n1": NODES["n1"]}, predictor=predictor)
        for hashes, tokens, family in (([1], -5, "f"), ([1 << 70], 40, "f"), ([-3], 40, "f"), ([1], 40, "\ud800")):
            routed = client.route("odd", hashes, tokens, family=family)
            assert (routed.source, routed.node_id) == (RouteSource.FALLBACK, "n1")
        assert not client.turn_end("\ud800", 1.0, 2.0, 10, 1)
        client.close()
        counters = client.counters()
        assert counters.errors_by_code == {"INVALID_REQUEST": 4} and client.breaker_state is BreakerState.CLOSED
        assert (counters.arrivals.sent, counters.arrivals.dropped) == (3, 1)
        assert counters.turn_ends.dropped == 1


def test_with_two_replicas_a_dead_one_costs_no_fallback(tmp_path):
    """Two schedulers that both know the nodes (as replicas do): requests are
    spread over both; with one stopped, every request is still answered by
    the other (none falls back), and the dead one's breaker opens."""
    ports = [free_port(), free_port()]
    settings = ClientSettings(deadline_s=2.0, breaker=BreakerSettings(failures_to_open=2, open_s=60.0))
    with grpc.insecure_channel(f"127.0.0.1:{ports[0]}", options=SCHEDULER_CHANNEL_OPTIONS) as first, \
            grpc.insecure_channel(f"127.0.0.1:{ports[1]}", options=SCHEDULER_CHANNEL_OPTIONS) as second:
        client = RoutingClient([first, second], settings=settings)
        with scheduler_on(ports[1], str(tmp_path / "b")) as survivor:
            for node, address in NODES.items():
                register(survivor, node, address)
            with scheduler_on(ports[0], str(tmp_path / "a")) as doomed:
                for node, address in NODES.items():
                    register(doomed, node, address)
                assert {route(client, i).source for i in range(4)} == {RouteSource.SCHEDULER}
                assert client.counters().routes_retried == 0
            answers = [route(client, 10 + i) for i in range(6)]
            assert {a.source for a in answers} == {RouteSource.SCHEDULER}
            counters = client.counters()
            assert counters.routes_fallback == 0
            assert counters.routes_retried >= 1  # the requests that met the dead replica first
            assert counters.errors_by_code.get("UNAVAILABLE", 0) >= 1
            assert client.breaker_state is BreakerState.CLOSED  # the survivor's breaker
