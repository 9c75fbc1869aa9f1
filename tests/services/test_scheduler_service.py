import threading

import grpc
import pytest

from speckv.services.common.clock import ManualClock
from speckv.v1 import common_pb2, scheduler_pb2
from tests.support.scheduler_service import register, scheduler
from tests.support.waiting import TIMEOUT, wait_until

S = common_pb2


@pytest.fixture
def sched():
    with scheduler() as (server, stub):
        yield stub


def code_of(call, *args):
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=TIMEOUT)
    return info.value.code()


def test_register_heartbeat_and_cluster_state(sched):
    reply = register(sched, "n1", "127.0.0.1:1")
    assert reply.node_id == "n1" and not reply.re_registered and reply.heartbeat_interval_ms == 1000
    assert register(sched, "n1", "127.0.0.1:2").re_registered
    hb = sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="n1", queued_tokens=40, running_tokens=7,
                                                        free_pages=100), timeout=TIMEOUT)
    assert hb.known
    state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    (node,) = state.nodes
    assert (node.node_id, node.address, node.alive, node.queued_tokens, node.running_tokens,
            node.free_pages, node.capacity_pages) == ("n1", "127.0.0.1:2", True, 40, 7, 100, 256)
    assert state.policy == "none" and state.now_s > 0
    assert {c.state for c in state.orders} == set(range(1, 7))


def test_unknown_node_heartbeat_is_not_known(sched):
    assert not sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="ghost"), timeout=TIMEOUT).known


def test_route_without_nodes_is_unavailable(sched):
    assert code_of(sched.Route, scheduler_pb2.RouteRequest(block_hashes=[1], prompt_tokens=64)) == \
        grpc.StatusCode.UNAVAILABLE


def test_route_falls_back_to_index_when_kvstore_is_down(sched):
    # nothing listens on port 1: the confirming Lookup fails fast and Route still answers
    register(sched, "n1", "127.0.0.1:1")
    reply = sched.Route(scheduler_pb2.RouteRequest(request_id="r", block_hashes=[11, 12], prompt_tokens=40),
                        timeout=TIMEOUT)
    assert reply.node_id == "n1" and reply.address == "127.0.0.1:1" and reply.cached_blocks == 0
    assert reply.family == "11" and reply.expected_ttft_ms == pytest.approx(reply.queue_ms + reply.prefill_ms)
    state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    assert state.nodes[0].routes_total == 1


@pytest.mark.parametrize("request_", [
    scheduler_pb2.RouteRequest(block_hashes=[1], prompt_tokens=0),
    scheduler_pb2.RouteRequest(block_hashes=[1, 2, 3], prompt_tokens=40),  # 3 x 16 > 40
    scheduler_pb2.RouteRequest(block_hashes=[5, 5], prompt_tokens=64),
])
def test_route_rejects_malformed(sched, request_):
    register(sched, "n1", "127.0.0.1:1")
    assert code_of(sched.Route, request_) == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("request_,code", [
    (scheduler_pb2.RegisterNodeRequest(node_id="", address="h:1", capacity_pages=4), "INVALID_ARGUMENT"),
    (scheduler_pb2.RegisterNodeRequest(node_id="n", address="", capacity_pages=4), "INVALID_ARGUMENT"),
    (scheduler_pb2.RegisterNodeRequest(node_id="n", address="h:1", capacity_pages=0), "INVALID_ARGUMENT"),
    (scheduler_pb2.RegisterNodeRequest(node_id="n", address="h:1", capacity_pages=4,
                                       geometry=S.KVGeometry(num_layers=2, num_kv_heads=2, head_dim=8,
                                                             dtype="int3", block_size=16)), "INVALID_ARGUMENT"),
])
def test_register_rejects_malformed(sched, request_, code):
    assert code_of(sched.RegisterNode, request_).name == code


def test_heartbeat_with_empty_id_is_invalid(sched):
    assert code_of(sched.Heartbeat, scheduler_pb2.HeartbeatRequest()) == grpc.StatusCode.INVALID_ARGUMENT


def test_policies(sched):
    info = sched.GetPolicy(scheduler_pb2.GetPolicyRequest(), timeout=TIMEOUT)
    assert info.name == "none" and "none" in info.available and info.description
    assert sched.SetPolicy(scheduler_pb2.SetPolicyRequest(name="none"), timeout=TIMEOUT).name == "none"
    with pytest.raises(grpc.RpcError) as err:
        sched.SetPolicy(scheduler_pb2.SetPolicyRequest(name="clairvoyant"), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "none" in err.value.details()


def order(**kw):
    base = dict(block_hashes=[1, 2, 3], source_node="a", target_node="b", lease_ms=60_000, family="fam")
    base.update(kw)
    return scheduler_pb2.SubmitOrderRequest(order=S.ReplicationOrder(**base))


def test_submit_watch_and_report(sched):
    register(sched, "a", "127.0.0.1:1")
    register(sched, "b", "127.0.0.1:2")
    stream = sched.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id="a"), timeout=60)
    first_id = sched.SubmitOrder(order(), timeout=TIMEOUT).order_id
    received = next(stream)
    assert received.order_id == first_id and received.target_address == "127.0.0.1:2"
    assert list(received.block_hashes) == [1, 2, 3] and received.policy == "manual"

    report = lambda state, oid=first_id: sched.ReportOrderStatus(  # noqa: E731
        scheduler_pb2.OrderStatusReport(order_id=oid, state=state, bytes_sent=10), timeout=TIMEOUT)
    assert report(S.ORDER_STATE_IN_FLIGHT).state == S.ORDER_STATE_IN_FLIGHT
    assert report(S.ORDER_STATE_COMMITTED).state == S.ORDER_STATE_COMMITTED
    with pytest.raises(grpc.RpcError) as err:
        report(S.ORDER_STATE_FAILED)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as err:
        report(S.ORDER_STATE_COMMITTED, "o-nope")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        report(S.ORDER_STATE_UNSPECIFIED)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    counts = {c.state: c.count for c in sched.GetClusterState(scheduler_pb2.ClusterStateRequest(),
                                                              timeout=TIMEOUT).orders}
    assert counts[S.ORDER_STATE_COMMITTED] == 1 and counts[S.ORDER_STATE_ISSUED] == 0
    stream.cancel()


def test_watch_replays_issued_orders_to_a_late_watcher(sched):
    register(sched, "a", "127.0.0.1:1")
    register(sched, "b", "127.0.0.1:2")
    order_id = sched.SubmitOrder(order(), timeout=TIMEOUT).order_id
    stream = sched.WatchOrders(scheduler_pb2.WatchOrdersRequest(), timeout=60)  # all sources
    assert next(stream).order_id == order_id
    stream.cancel()


@pytest.mark.parametrize("kw,code", [
    (dict(source_node="ghost"), "NOT_FOUND"),
    (dict(target_node="a"), "INVALID_ARGUMENT"),
    (dict(block_hashes=[]), "INVALID_ARGUMENT"),
    (dict(lease_ms=0), "INVALID_ARGUMENT"),
    (dict(source_node=""), "INVALID_ARGUMENT"),
])
def test_submit_rejects_malformed(sched, kw, code):
    register(sched, "a", "127.0.0.1:1")
    register(sched, "b", "127.0.0.1:2")
    assert code_of(sched.SubmitOrder, order(**kw)).name == code


def test_submit_without_order_and_watch_unknown_node(sched):
    assert code_of(sched.SubmitOrder, scheduler_pb2.SubmitOrderRequest()) == grpc.StatusCode.INVALID_ARGUMENT
    stream = sched.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id="ghost"), timeout=TIMEOUT)
    with pytest.raises(grpc.RpcError) as err:
        next(stream)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_oversize_message_is_resource_exhausted():
    with scheduler(max_message_mb=1) as (_, stub):
        # 200k uint64 hashes of 10 varint bytes each: ~2 MB against a 1 MiB limit
        big = scheduler_pb2.RouteRequest(block_hashes=list(range(1 << 63, (1 << 63) + 200_000)),
                                         prompt_tokens=4_000_000)
        assert code_of(stub.Route, big) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_silent_node_goes_down_then_revives():
    clock = ManualClock(500.0)
    with scheduler(clock=clock, node_timeout_s=5.0) as (_, stub):
        register(stub, "n1", "127.0.0.1:1")
        clock.advance(6.0)
        state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
        assert not state.nodes[0].alive and state.nodes[0].last_heartbeat_age_s == pytest.approx(6.0)
        assert code_of(stub.Route, scheduler_pb2.RouteRequest(prompt_tokens=10)) == grpc.StatusCode.UNAVAILABLE
        assert code_of(stub.SubmitOrder, order(source_node="n1", target_node="n1")) == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert stub.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="n1"), timeout=TIMEOUT).known
        assert stub.Route(scheduler_pb2.RouteRequest(prompt_tokens=10), timeout=TIMEOUT).node_id == "n1"


def test_order_lease_expires_on_tick():
    clock = ManualClock(0.0)
    with scheduler(clock=clock) as (_, stub):
        register(stub, "a", "127.0.0.1:1")
        register(stub, "b", "127.0.0.1:2")
        order_id = stub.SubmitOrder(order(lease_ms=1000), timeout=TIMEOUT).order_id
        clock.advance(2.0)

        def expired():
            counts = {c.state: c.count for c in stub.GetClusterState(
                scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT).orders}
            return counts[S.ORDER_STATE_EXPIRED] == 1
        assert wait_until(expired)
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportOrderStatus(scheduler_pb2.OrderStatusReport(order_id=order_id, state=S.ORDER_STATE_COMMITTED),
                                   timeout=TIMEOUT)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_watch_stream_ends_when_server_stops():
    with scheduler() as (server, stub):
        register(stub, "a", "127.0.0.1:1")
        stream = stub.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id="a"), timeout=60)
        ended = threading.Event()

        def drain():
            try:
                for _ in stream:
                    pass
            except grpc.RpcError:
                pass
            ended.set()
        threading.Thread(target=drain, daemon=True).start()
        assert wait_until(lambda: stream.is_active() and not ended.is_set(), timeout=2.0)
        server.stop(grace_s=5.0)
        assert ended.wait(TIMEOUT)


def test_gauges_report_live_nodes_and_orders():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from speckv.services.common.rpc.telemetry import build_telemetry

    reader = InMemoryMetricReader()
    with scheduler(telemetry=build_telemetry("scheduler", {}, metric_readers=(reader,))) as (_, stub):
        register(stub, "a", "127.0.0.1:1")
        register(stub, "b", "127.0.0.1:2")
        stub.SubmitOrder(order(), timeout=TIMEOUT)
        points = {}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for p in metric.data.data_points:
                        if metric.name.startswith("speckv.scheduler."):
                            points[(metric.name, tuple(sorted(p.attributes.items())))] = p.value
        assert points[("speckv.scheduler.live_nodes", ())] == 2
        assert points[("speckv.scheduler.orders", (("state", "issued"),))] == 1
        assert points[("speckv.scheduler.orders", (("state", "committed"),))] == 0


def test_heartbeats_merge_the_fields_they_carry(sched):
    """A kvstore heartbeat (free pages only) leaves the engine's queue alone."""
    register(sched, "a", "127.0.0.1:1")
    sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="a", queued_tokens=4096, running_tokens=70,
                                                   num_waiting_requests=3, num_running_requests=1), timeout=TIMEOUT)
    sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="a", free_pages=7), timeout=TIMEOUT)
    node = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT).nodes[0]
    assert (node.queued_tokens, node.running_tokens, node.free_pages) == (4096, 70, 7)
    sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="a", queued_tokens=0, num_waiting_requests=0),
                    timeout=TIMEOUT)
    node = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT).nodes[0]
    assert (node.queued_tokens, node.running_tokens, node.free_pages) == (0, 70, 7)


def test_a_cancelled_order_reaches_its_source_watcher_marked_cancelled(sched):
    register(sched, "a", "127.0.0.1:1")
    register(sched, "b", "127.0.0.1:2")
    stream = sched.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id="a"), timeout=60)
    order_id = sched.SubmitOrder(order(), timeout=TIMEOUT).order_id
    issued = next(stream)
    assert issued.order_id == order_id and not issued.cancelled
    sched.ReportOrderStatus(scheduler_pb2.OrderStatusReport(order_id=order_id, state=S.ORDER_STATE_CANCELLED),
                            timeout=TIMEOUT)
    again = next(stream)
    assert again.order_id == order_id and again.cancelled
    stream.cancel()


def test_routes_follow_the_engines_own_queue_estimate(sched):
    """Node a reports few queued tokens but a long prefill ahead (one huge
    prompt): the token-linear estimate would pick it; its own estimate does not."""
    register(sched, "a", "127.0.0.1:1")
    register(sched, "b", "127.0.0.1:2")
    sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="a", queued_tokens=10, num_waiting_requests=1,
                                                   queued_prefill_ms=9000.0), timeout=TIMEOUT)
    sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="b", queued_tokens=500, num_waiting_requests=3,
                                                   queued_prefill_ms=50.0), timeout=TIMEOUT)
    reply = sched.Route(scheduler_pb2.RouteRequest(request_id="r", prompt_tokens=40), timeout=TIMEOUT)
    assert reply.node_id == "b" and reply.queue_ms == pytest.approx(50.0)


def test_a_negative_queue_estimate_is_invalid_and_changes_nothing(sched):
    register(sched, "a", "127.0.0.1:1")
    sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="a", queued_tokens=4096), timeout=TIMEOUT)
    with pytest.raises(grpc.RpcError) as err:
        sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="a", queued_tokens=1, queued_prefill_ms=-5.0),
                        timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "queued_prefill_ms" in err.value.details()
    node = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT).nodes[0]
    assert node.queued_tokens == 4096
