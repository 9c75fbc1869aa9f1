"""Scheduler replicas on a real three-member etcd (three etcd processes on
loopback, tests/support/etcd.py): the client fails over between members, so
a dead member stops neither the election nor the shared state, whether it
is the member the replicas were asking or etcd's own raft leader; and an
endpoint list with no live member fails with Unavailable naming each."""
from __future__ import annotations

import time
import uuid

import pytest
from etcd3gw.client import Etcd3Client

from speckv.services.cluster.ports import free_ports
from speckv.services.common.errors import Unavailable
from speckv.services.scheduler.leadership.adapters.etcd_keys import EtcdKeys
from speckv.services.scheduler.leadership.etcd_elector import EtcdElector
from speckv.services.scheduler.leadership.keys import leader_key
from speckv.services.scheduler.leadership.state_store import EtcdStateStore
from tests.support.etcd import EtcdCluster, EtcdServer, etcd_cluster  # noqa: F401 - fixture
from tests.support import waiting

LEASE_S = 2
WAIT_S = 60.0  # generous: two shared cores, three etcd members


def wait_for(predicate, what):
    waiting.wait_for(predicate, what, WAIT_S)


def raft_leader(cluster: EtcdCluster) -> EtcdServer:
    """The member etcd's own raft elected (maintenance/status: leader == member_id)."""
    for member in cluster.members:
        host, port = member.endpoint.removeprefix("http://").rsplit(":", 1)
        status = Etcd3Client(host, int(port), timeout=2.0, api_path="/v3/").status()
        if status["leader"] == status["header"]["member_id"]:
            return member
    raise AssertionError("no member says it leads")


def the_leader(*electors):
    wait_for(lambda: sum(e.current().is_leader for e in electors) == 1, "exactly one leader")
    return next(e for e in electors if e.current().is_leader)


@pytest.fixture
def replicas(etcd_cluster):
    """make(name, endpoints): an elector over those endpoints, stopped (lease left to lapse) at the end."""
    made = []
    cluster = f"t-{uuid.uuid4().hex[:8]}"

    def make(name, endpoints):
        elector = EtcdElector(EtcdKeys(endpoints, timeout_s=0.3), cluster, name, f"{name}:50051", lease_s=LEASE_S)
        made.append(elector)
        elector.start()
        return elector
    yield cluster, make
    for elector in made:
        elector.stop(resign=False)


def test_the_member_the_replicas_ask_dying_changes_neither_leader_nor_state(etcd_cluster, replicas):  # noqa: F811
    cluster, make = replicas
    raft = raft_leader(etcd_cluster)
    asked = next(m for m in etcd_cluster.members if m is not raft)  # a follower member, first in the list
    endpoints = [asked.endpoint] + [m.endpoint for m in etcd_cluster.members if m is not asked]
    a, b = make("a", endpoints), make("b", endpoints)
    leader = the_leader(a, b)
    epoch = leader.current().epoch
    store = EtcdStateStore(EtcdKeys(endpoints, timeout_s=0.3), cluster)
    store.fence(epoch)
    store.policy_set("reactive-heat")

    asked.kill()
    store.policy_set("oracle")  # the next member takes the write, fenced by the same epoch
    assert store.load().policy == "oracle"
    time.sleep(2 * LEASE_S)  # several keep-alive rounds, all through the remaining members
    assert leader.current().is_leader and leader.current().epoch == epoch
    follower = b if leader is a else a
    assert not follower.current().is_leader and follower.current().epoch == epoch

    leader.stop(resign=False)  # the leader dies too: its lease lapses on the two remaining members
    wait_for(lambda: follower.current().is_leader, "the other replica takes over")
    assert follower.current().epoch > epoch
    with pytest.raises(Exception, match="no longer leads"):
        store.policy_set("none")  # the old epoch is fenced out on the remaining members
    store.fence(follower.current().epoch)
    store.policy_set("none")
    assert store.load().policy == "none"


def test_etcds_own_leader_dying_leaves_one_replica_leading(etcd_cluster, replicas):  # noqa: F811
    cluster, make = replicas
    endpoints = etcd_cluster.endpoints
    a, b = make("a", endpoints), make("b", endpoints)
    epoch = the_leader(a, b).current().epoch
    raft_leader(etcd_cluster).kill()
    # etcd elects a new raft leader among the two left; the replicas' calls fail over to them meanwhile.
    # The lead may survive the pause or move to a new epoch; either way exactly one leads and can write.
    wait_for(lambda: sum(e.current().is_leader for e in (a, b)) == 1 and raft_leader_alive(etcd_cluster),
             "one replica leads on the surviving members")
    leader = the_leader(a, b)
    assert leader.current().epoch >= epoch
    store = EtcdStateStore(EtcdKeys(endpoints, timeout_s=0.3), cluster)
    store.fence(leader.current().epoch)
    deadline = time.monotonic() + WAIT_S
    while True:  # the lead itself may move once more while etcd settles
        try:
            store.fence(the_leader(a, b).current().epoch)
            store.policy_set("reactive-heat")
            break
        except Exception:  # noqa: BLE001 - retried until the deadline, then re-raised
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert EtcdStateStore(EtcdKeys(endpoints), cluster).load().policy == "reactive-heat"


def raft_leader_alive(cluster: EtcdCluster) -> bool:
    try:
        return raft_leader(EtcdCluster(tuple(m for m in cluster.members if m.alive))).alive
    except Exception:  # noqa: BLE001 - no leader yet (elections under way): not yet
        return False


def test_dead_endpoints_are_passed_over_and_all_dead_is_unavailable_naming_each(etcd_cluster):  # noqa: F811
    dead = [f"http://127.0.0.1:{port}" for port in free_ports(2)]  # nothing listens there
    keys = EtcdKeys([dead[0], etcd_cluster.members[0].endpoint, dead[1]], timeout_s=0.5)
    lease, _ = keys.grant(LEASE_S)
    key = leader_key(f"t-{uuid.uuid4().hex[:8]}")
    assert keys.campaign(key, b"{}", lease).won
    assert keys.read(key).lease == lease
    keys.revoke(lease)
    assert keys.read(key) is None

    nobody = EtcdKeys(dead, timeout_s=0.5)
    with pytest.raises(Unavailable) as raised:
        nobody.read(key)
    assert dead[0] in str(raised.value) and dead[1] in str(raised.value)
