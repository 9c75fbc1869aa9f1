"""Scheduler replicas found through DNS (issue 46, deployable where addresses
are not known up front): two replicas on a real etcd whose --peers and the
kvstore's --scheduler are dns: entries naming both (as a Kubernetes headless
Service does, each replica among them), resolved by the system resolver
(localhost: 127.0.0.1). The kvstore links to both, each replica shares its
routes with the other, and the leader key names the replica's
--advertise-address; a replica's RouteSharing leaves its own address out."""
from __future__ import annotations

import contextlib
from typing import Iterator

from speckv.services.cluster.ports import free_ports
from speckv.services.common.discovery_watch import own_addresses
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.adapters.route_sharing import RouteSharing
from speckv.services.scheduler.routing.observation import RouteObservation
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.support.etcd import fresh_etcd  # noqa: F401 - a fixture
from tests.support.kvstore_service import kvstore
from tests.support.scheduler_service import scheduler
from tests.support.waiting import TIMEOUT, wait_until


@contextlib.contextmanager
def replica(endpoint: str, name: str, port: int, peers: str) -> Iterator[scheduler_pb2_grpc.SchedulerStub]:
    with scheduler(port=port, etcd=endpoint, replica_id=name, peers=peers, cluster_name="dns", node_timeout_s=30.0,
                   advertise_address=f"localhost:{port}") as (_, stub):
        yield stub


def state(stub) -> scheduler_pb2.ClusterState:
    return stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)


def routes(stub) -> dict[str, int]:
    return {n.node_id: n.routes_total for n in state(stub).nodes}


def route(stub, request_id: str) -> str:
    return stub.Route(scheduler_pb2.RouteRequest(request_id=request_id, block_hashes=[7001], prompt_tokens=16,
                                                 family=request_id), timeout=TIMEOUT).node_id


def test_replicas_and_kvstores_find_each_other_through_dns(fresh_etcd):  # noqa: F811
    a_port, b_port = free_ports(2)
    everyone = f"dns:localhost:{a_port},dns:localhost:{b_port}"
    with replica(fresh_etcd.endpoint, "a", a_port, everyone) as a, \
            replica(fresh_etcd.endpoint, "b", b_port, everyone) as b, \
            kvstore(node_id="n1", geometry="tiny", scheduler=everyone, heartbeat_interval_s=0.2):
        assert wait_until(lambda: {n.node_id for n in state(a).nodes if n.alive} == {"n1"}
                          == {n.node_id for n in state(b).nodes if n.alive})
        assert wait_until(lambda: state(b).leadership.leader_id in ("a", "b"))
        leadership = state(b).leadership
        leader_port = a_port if leadership.leader_id == "a" else b_port
        assert leadership.leader_address == f"localhost:{leader_port}", leadership

        before_a, before_b = routes(a)["n1"], routes(b)["n1"]
        assert route(a, "from-a") == "n1"
        assert wait_until(lambda: routes(b)["n1"] == before_b + 1)  # a shared its route with b
        assert route(b, "from-b") == "n1"
        assert wait_until(lambda: routes(a)["n1"] == before_a + 2)  # and b with a


def test_a_replica_shares_with_every_resolved_peer_but_itself():
    """RouteSharing as ReplicaSetup makes it, its own address in the dns:
    list: the sender to the other peer, a real scheduler, applies the
    observations; none exists for itself."""
    with scheduler(policy="none") as (peer_server, peer):
        me = free_ports(1)[0]
        sharing = RouteSharing("me", f"dns:localhost:{me},dns:localhost:{peer_server.port}", None,
                               exclude=own_addresses({f"localhost:{me}", f"127.0.0.1:{me}"}), flush_s=0.01).start()
        try:
            assert wait_until(lambda: sharing.peers() == (f"127.0.0.1:{peer_server.port}",))
            sharing.share([RouteObservation(Family("f"), [1, 2], 32, NodeId("n9"), 0, 0, None, None, 0.0, 32, 0.0)])
            peer_address = f"127.0.0.1:{peer_server.port}"
            assert wait_until(lambda: sharing.stats()[peer_address].sent == 1), sharing.stats()
            assert state(peer).leadership.answering_is_leader  # a single scheduler took it
        finally:
            sharing.stop()
