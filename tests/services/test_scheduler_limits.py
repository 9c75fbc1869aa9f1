"""The scheduler's limits (issue 23, items 3 and 4; docs/limits.md), served
for real on loopback: idle WatchOrders streams cannot starve routes or
heartbeats, and one over the cap is RESOURCE_EXHAUSTED; prompt_tokens
beyond the model's context and overlong family names are INVALID_ARGUMENT
and change nothing; undecodable bytes are INVALID_ARGUMENT with no
traceback in the log."""
from __future__ import annotations

import logging

import grpc
import pytest

from speckv.v1 import common_pb2, scheduler_pb2
from tests.support.scheduler_service import register, scheduler
from tests.support.waiting import TIMEOUT

MIB_NAME = "f" * (1 << 20)
MAX_PROMPT = 4096


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.details()
    return info.value.code()


def watch(stub, count: int) -> list:
    """count WatchOrders calls, each settled: admitted (headers came) or refused (ended)."""
    calls = [stub.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id="n1"), timeout=6 * TIMEOUT)
             for _ in range(count)]
    for call in calls:
        call.initial_metadata()
    return calls


def refused(calls: list) -> list[grpc.StatusCode]:
    return [c.code() for c in calls if c.done()]


def route(stub, prompt_tokens: int = 64, family: str = "") -> scheduler_pb2.RouteResponse:
    return stub.Route(scheduler_pb2.RouteRequest(request_id="r", block_hashes=[11, 12], prompt_tokens=prompt_tokens,
                                                 family=family), timeout=TIMEOUT)


def node_state(stub) -> scheduler_pb2.NodeState:
    (node,) = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT).nodes
    return node


def test_idle_watch_streams_leave_routes_and_heartbeats_their_threads_and_one_more_is_refused():
    with scheduler(workers=4, max_streams=40, max_streams_per_peer=40, confirm_routes=False) as (_server, stub):
        register(stub, "n1", "127.0.0.1:1")
        held = watch(stub, 40)
        assert refused(held) == []
        assert refused(watch(stub, 5)) == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 5
        for _ in range(8):  # more unary calls than the 4 threads kept for them, one after another
            assert stub.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="n1"), timeout=TIMEOUT).known
            assert route(stub).node_id == "n1"
        assert node_state(stub).alive
        for call in held:
            call.cancel()


def test_prompt_tokens_beyond_the_context_are_refused_and_book_nothing():
    with scheduler(max_prompt_tokens=MAX_PROMPT, confirm_routes=False) as (_server, stub):
        register(stub, "n1", "127.0.0.1:1")
        assert route(stub, prompt_tokens=MAX_PROMPT).node_id == "n1"  # the context itself is fine
        before = node_state(stub)
        for tokens in (MAX_PROMPT + 1, (1 << 32) - 1):
            assert code_of(lambda: route(stub, prompt_tokens=tokens)) == grpc.StatusCode.INVALID_ARGUMENT
        batch = scheduler_pb2.RouteBatchRequest(requests=[
            scheduler_pb2.RouteRequest(request_id="ok", block_hashes=[21], prompt_tokens=64),
            scheduler_pb2.RouteRequest(request_id="big", block_hashes=[22], prompt_tokens=(1 << 32) - 1)])
        with pytest.raises(grpc.RpcError) as info:
            stub.RouteBatch(batch, timeout=TIMEOUT)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "requests[1]" in info.value.details()
        after = node_state(stub)
        assert (after.queued_tokens, after.routes_total) == (before.queued_tokens, before.routes_total)


def test_overlong_family_names_are_refused_and_kept_nowhere():
    with scheduler(max_family_chars=256, confirm_routes=False) as (_server, stub):
        register(stub, "a", "127.0.0.1:1")
        register(stub, "b", "127.0.0.1:2")
        families = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT).num_families
        assert code_of(lambda: route(stub, family=MIB_NAME)) == grpc.StatusCode.INVALID_ARGUMENT
        submit = scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
            block_hashes=[1], source_node="a", target_node="b", lease_ms=60_000, family=MIB_NAME))
        assert code_of(lambda: stub.SubmitOrder(submit, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
        state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
        assert state.num_families == families and sum(c.count for c in state.orders) == 0
        assert route(stub, family="f" * 256).family == "f" * 256


def test_undecodable_bytes_are_invalid_argument_without_a_traceback(caplog):
    caplog.set_level(logging.DEBUG)
    with scheduler() as (server, _stub), grpc.insecure_channel(server.address) as channel:
        route_raw = channel.unary_unary("/speckv.v1.Scheduler/Route")
        watch_raw = channel.unary_stream("/speckv.v1.Scheduler/WatchOrders")
        bad_utf8 = b"\x0a\x02\xc3\x28"  # field 1 (request_id), a string, with invalid UTF-8
        assert code_of(lambda: route_raw(b"\xff\xff\xff\xff", timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(lambda: route_raw(bad_utf8, timeout=TIMEOUT)) == grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(lambda: list(watch_raw(b"\x0a\x02\xc3\x28", timeout=TIMEOUT))) == \
            grpc.StatusCode.INVALID_ARGUMENT
    assert [r for r in caplog.records if r.exc_info or "deserializ" in r.getMessage().lower()] == []
