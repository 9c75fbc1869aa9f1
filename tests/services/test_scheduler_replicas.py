"""Two scheduler replicas on a real etcd with real kvstores (issue 46):
one leads and plans, both answer Route and know every node, the kvstores
learn the leader's epoch, only the leader takes orders, a Route answered by
the follower reaches the leader's planner state, and when the leader stops
the other takes the order log over at a larger epoch and the kvstores fence
the old one."""
from __future__ import annotations

import grpc
import pytest

from speckv.services.cluster.ports import free_ports
from speckv.v1 import common_pb2, kvstore_pb2, scheduler_pb2
from tests.support.etcd import fresh_etcd  # noqa: F401 - a fixture
from tests.support.kvstore_service import kvstore
from tests.support.scheduler_service import scheduler
from tests.support.waiting import TIMEOUT, wait_until

CHAIN = [3001, 3002, 3003, 3004]
BLOCK_BYTES = 512  # the "tiny" geometry's block


def replica(endpoint: str, name: str, port: int, peer: int, cluster: str):
    """A scheduler replica on loopback: (server, stub) while open."""
    return scheduler(port=port, etcd=endpoint, replica_id=name, peers=f"127.0.0.1:{peer}", cluster_name=cluster,
                     node_timeout_s=30.0)


def state(stub) -> scheduler_pb2.ClusterState:
    return stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)


def alive(stub) -> set[str]:
    return {n.node_id for n in state(stub).nodes if n.alive}


def committed(stub) -> int:
    return {c.state: c.count for c in state(stub).orders}.get(common_pb2.ORDER_STATE_COMMITTED, 0)


def put_chain(kv) -> None:
    def messages():
        for i, h in enumerate(CHAIN):
            yield kvstore_pb2.PutBlockRequest(block_hash=h, data=bytes([i + 1]) * BLOCK_BYTES, family="doc",
                                              parent_hash=CHAIN[i - 1] if i else 0, has_parent=i > 0)
    kv.PutBlocks(messages(), timeout=TIMEOUT)


def order(target: str) -> scheduler_pb2.SubmitOrderRequest:
    return scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
        family="doc", block_hashes=CHAIN, source_node="n1", target_node=target, lease_ms=60_000))


def test_one_leads_both_route_and_the_other_takes_the_log_over(fresh_etcd):  # noqa: F811
    a_port, b_port = free_ports(2)
    endpoint = fresh_etcd.endpoint
    schedulers = f"127.0.0.1:{a_port},127.0.0.1:{b_port}"
    leader = replica(endpoint, "a", a_port, b_port, "t1")
    _, a = leader.__enter__()
    try:
        assert wait_until(lambda: state(a).leadership.answering_is_leader)  # the first one up leads
        with replica(endpoint, "b", b_port, a_port, "t1") as (_, b), \
                kvstore(node_id="n1", geometry="tiny", scheduler=schedulers, heartbeat_interval_s=0.2) as (_, kv1), \
                kvstore(node_id="n2", geometry="tiny", scheduler=schedulers, heartbeat_interval_s=0.2) as (_, kv2), \
                kvstore(node_id="n3", geometry="tiny", scheduler=schedulers, heartbeat_interval_s=0.2):
            assert wait_until(lambda: alive(a) == alive(b) == {"n1", "n2", "n3"})
            first = state(b).leadership
            assert not first.answering_is_leader and first.leader_id == "a" and first.epoch > 0
            assert wait_until(lambda: newest_epoch(kv1) == first.epoch)

            # only the leader takes orders; the follower names it
            with pytest.raises(grpc.RpcError) as refused:
                b.SubmitOrder(order("n2"), timeout=TIMEOUT)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "the leader is a at" in refused.value.details()
            put_chain(kv1)
            assert wait_until(lambda: all(blocks(x, "n1") == len(CHAIN) for x in (a, b)))
            first_order = a.SubmitOrder(order("n2"), timeout=TIMEOUT).order_id
            assert wait_until(lambda: committed(a) == 1)

            # a Route answered by the follower reaches the leader's planner state (the node's routes and load)
            routed = routes(a)
            reply = b.Route(scheduler_pb2.RouteRequest(request_id="r", block_hashes=[9001, 9002], prompt_tokens=40,
                                                       family="shared-by-b"), timeout=TIMEOUT)
            assert routes(b)[reply.node_id] == routed[reply.node_id] + 1
            assert wait_until(lambda: routes(a)[reply.node_id] == routed[reply.node_id] + 1), (routed, routes(a))

            # the leader stops (and resigns): b is elected at a larger epoch, adopts the log, and leads
            leader.__exit__(None, None, None)
            leader = None
            assert wait_until(lambda: state(b).leadership.answering_is_leader)
            second = state(b).leadership
            assert second.epoch > first.epoch and second.leader_id == "b"
            assert committed(b) == 1  # the order a journaled, adopted
            assert wait_until(lambda: newest_epoch(kv1) == second.epoch)
            second_order = b.SubmitOrder(order("n3"), timeout=TIMEOUT).order_id
            assert second_order != first_order  # ids continue where the old leader stopped
            assert wait_until(lambda: committed(b) == 2)
            counters = kv1.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).order_counters
            assert counters["run"] == 2 and counters["run_twice"] == 0
    finally:
        if leader is not None:
            leader.__exit__(None, None, None)


def newest_epoch(kv) -> int:
    return kv.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).order_counters["newest_epoch"]


def routes(stub) -> dict[str, int]:
    return {n.node_id: n.routes_total for n in state(stub).nodes}


def blocks(stub, node: str) -> int:
    return next((n.num_blocks for n in state(stub).nodes if n.node_id == node), 0)
