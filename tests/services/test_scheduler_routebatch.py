"""RouteBatch, run-time policy switching and the replica counters over real gRPC."""
import grpc
import pytest

from speckv.v1 import scheduler_pb2
from tests.support.scheduler_service import register, scheduler
from tests.support.waiting import TIMEOUT


@pytest.fixture
def sched():
    with scheduler(confirm_routes=False) as (_, stub):
        yield stub


def test_route_batch_answers_in_order_and_spreads(sched):
    for n in ("n1", "n2"):
        register(sched, n, "127.0.0.1:1")
    requests = [scheduler_pb2.RouteRequest(request_id=f"r{i}", block_hashes=[100 + i, 200 + i], prompt_tokens=40)
                for i in range(10)]
    reply = sched.RouteBatch(scheduler_pb2.RouteBatchRequest(requests=requests), timeout=TIMEOUT)
    assert [r.family for r in reply.responses] == [str(100 + i) for i in range(10)]
    assert {r.node_id for r in reply.responses} == {"n1", "n2"}
    state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    assert sum(n.routes_total for n in state.nodes) == 10


def test_route_batch_names_the_malformed_item(sched):
    register(sched, "n1", "127.0.0.1:1")
    requests = [scheduler_pb2.RouteRequest(block_hashes=[1], prompt_tokens=40),
                scheduler_pb2.RouteRequest(block_hashes=[1], prompt_tokens=0)]
    with pytest.raises(grpc.RpcError) as err:
        sched.RouteBatch(scheduler_pb2.RouteBatchRequest(requests=requests), timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "requests[1]" in err.value.details()


def test_policies_switch_at_run_time_and_say_what_they_lack(sched):
    info = sched.SetPolicy(scheduler_pb2.SetPolicyRequest(name="reactive-heat"), timeout=TIMEOUT)
    assert info.name == "reactive-heat" and "heat" in info.description
    assert list(info.available) == ["affinity", "none", "oracle", "predictive", "reactive-heat", "reactive-migrate"]
    for name, flag in (("predictive", "--predictor"), ("oracle", "--oracle-trace")):
        with pytest.raises(grpc.RpcError) as err:
            sched.SetPolicy(scheduler_pb2.SetPolicyRequest(name=name), timeout=TIMEOUT)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and flag in err.value.details()
    assert sched.GetPolicy(scheduler_pb2.GetPolicyRequest(), timeout=TIMEOUT).name == "reactive-heat"
    state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    assert state.policy == "reactive-heat" and state.replicas_committed == 0 and state.bytes_wasted == 0


def test_affinity_set_at_run_time_co_locates_an_identical_burst_that_none_spreads(sched):
    for n in ("n1", "n2", "n3", "n4"):
        register(sched, n, "127.0.0.1:1")

    def burst(base: int) -> set[str]:
        requests = [scheduler_pb2.RouteRequest(request_id=f"b{base}-{i}", block_hashes=[base, base + 1],
                                               prompt_tokens=40) for i in range(6)]
        reply = sched.RouteBatch(scheduler_pb2.RouteBatchRequest(requests=requests), timeout=TIMEOUT)
        return {r.node_id for r in reply.responses}

    assert len(burst(1000)) > 1  # `none`: the router spreads the burst as its queue builds
    info = sched.SetPolicy(scheduler_pb2.SetPolicyRequest(name="affinity"), timeout=TIMEOUT)
    assert info.name == "affinity" and "llm-d" in info.description
    assert len(burst(2000)) == 1  # one window (one batch, one instant): the whole group on one node
    assert sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT).replicas_committed == 0
