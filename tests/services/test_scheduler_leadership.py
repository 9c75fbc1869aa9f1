"""Scheduler replicas' election and shared state on a real etcd (the etcd
binary on loopback, tests/support/etcd.py): one leader among two, failover
at a larger epoch when the leader dies or loses its lease, a deposed
leader's writes refused, a new leader loading exactly what the old one
journaled, and what an etcd that dies does to both."""
from __future__ import annotations

import time
import uuid

import pytest

from speckv.services.common.errors import FailedPrecondition, Unavailable
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.adapters.state_store import StateStore
from speckv.services.scheduler.leadership import adapters
from speckv.services.scheduler.leadership.adapters.etcd_keys import EtcdKeys
from speckv.services.scheduler.leadership.etcd_elector import EtcdElector
from speckv.services.scheduler.leadership.keys import leader_key, state_prefix
from speckv.services.scheduler.leadership.state_store import EtcdStateStore
from speckv.services.scheduler.orders import OrderSpec, OrderState, OrderTracker
from speckv.services.scheduler.ports import SavedNode
from tests.support.etcd import etcd_server, fresh_etcd  # noqa: F401 - fixtures
from tests.support import waiting

LEASE_S = 2
WAIT_S = 60.0  # generous: failover takes under two leases; two shared cores


def wait_for(predicate, what):
    waiting.wait_for(predicate, what, WAIT_S)


@pytest.fixture
def cluster():
    return f"t-{uuid.uuid4().hex[:8]}"  # tests share the module's etcd, each under its own key prefix


@pytest.fixture
def electors(etcd_server, cluster):
    made = []

    def make(name):
        e = EtcdElector(EtcdKeys(etcd_server.endpoint), cluster, name, f"{name}:50051", lease_s=LEASE_S)
        made.append(e)
        e.start()
        return e
    yield make
    for e in made:
        e.stop()


def leader_of(*electors):
    wait_for(lambda: sum(e.current().is_leader for e in electors) == 1, "exactly one leader")
    return next(e for e in electors if e.current().is_leader)


def test_two_replicas_elect_exactly_one_leader_and_the_other_follows_it(electors):
    a, b = electors("a"), electors("b")
    leader = leader_of(a, b)
    follower = b if leader is a else a
    wait_for(lambda: follower.current().leader_id == leader.replica_id, "the follower sees the leader")
    epoch = leader.current().epoch
    samples = []
    deadline = time.monotonic() + 3 * LEASE_S  # several keep-alive rounds
    while time.monotonic() < deadline:
        samples.append((a.current().is_leader, b.current().is_leader, leader.current().epoch))
        time.sleep(0.05)
    assert {(s[0] + s[1], s[2]) for s in samples} == {(1, epoch)}
    assert follower.current().leader_address == f"{leader.replica_id}:50051"


def test_a_killed_leader_is_replaced_at_a_larger_epoch(electors, capsys):
    a, b = electors("a"), electors("b")
    leader = leader_of(a, b)
    follower = b if leader is a else a
    epoch = leader.current().epoch
    killed = time.monotonic()
    leader.stop(resign=False)  # its keep-alives stop; the lease lapses on the server
    wait_for(lambda: follower.current().is_leader, "the follower leads")
    took = time.monotonic() - killed
    assert follower.current().epoch > epoch
    with capsys.disabled():
        print(f"\nfailover after the leader's keep-alives stopped: {took:.2f} s (lease {LEASE_S} s)")


def test_a_leader_whose_lease_is_revoked_steps_down_and_a_new_epoch_leads(electors, etcd_server, cluster):
    a, b = electors("a"), electors("b")
    leader = leader_of(a, b)
    epoch = leader.current().epoch
    keys = EtcdKeys(etcd_server.endpoint)
    keys.revoke(keys.read(leader_key(cluster)).lease)
    wait_for(lambda: leader.current().epoch != epoch or not leader.current().is_leader, "the leader notices")
    new = leader_of(a, b)
    assert new.current().epoch > epoch


def journal(store: EtcdStateStore, sqlite: StateStore) -> OrderTracker:
    """A leader's history into both stores (the SQLite one as the reference)."""
    class Tee:
        def __getattr__(self, name):
            return lambda *args: [getattr(s, name)(*args) for s in (store, sqlite)]
    tee = Tee()
    tee.policy_set("reactive-heat")
    for n, address in (("n1", "h:1"), ("n2", "h:2"), ("n1", "h:3")):
        tee.node_registered(SavedNode(NodeId(n), address, NodeSizes(64, 128, 32), KVGeometry(2, 2, 16, "float32", 4)))
    tracker = OrderTracker(max_retained=3, journal=tee)
    orders = [tracker.submit(OrderSpec(Family("f"), [2**64 - 1, i], NodeId("n1"), NodeId("n2"), 10_000,
                                       tier=Tier.HOST if i % 2 else None), now=float(i)) for i in range(8)]
    tracker.report(orders[0].order_id, OrderState.IN_FLIGHT, 9.0, bytes_sent=4096, blocks_sent=1)
    for order, state in zip(orders[1:6], (OrderState.COMMITTED, OrderState.FAILED, OrderState.COMMITTED,
                                          OrderState.CANCELLED, OrderState.COMMITTED)):
        tracker.report(order.order_id, state, 10.0)
    return tracker


def test_a_deposed_leader_cannot_write_and_the_new_leader_loads_what_it_journaled(electors, etcd_server, cluster,
                                                                                  tmp_path, monkeypatch):
    a, b = electors("a"), electors("b")
    old = leader_of(a, b)
    successor = b if old is a else a
    old_store = EtcdStateStore(EtcdKeys(etcd_server.endpoint), cluster)
    old_store.fence(old.current().epoch)
    sqlite = StateStore.open(tmp_path / "state")
    journal(old_store, sqlite)
    expected = sqlite.load()
    sqlite.close()

    old.stop(resign=False)  # killed: still fenced at its old epoch
    wait_for(lambda: successor.current().is_leader, "the successor leads")
    with pytest.raises(FailedPrecondition, match="no longer leads"):
        old_store.policy_set("oracle")
    with pytest.raises(FailedPrecondition, match="no longer leads"):
        OrderTracker(journal=old_store).submit(OrderSpec(Family("f"), [1], NodeId("n1"), NodeId("n2"), 10), now=1.0)

    new_store = EtcdStateStore(EtcdKeys(etcd_server.endpoint), cluster)
    new_store.fence(successor.current().epoch)
    monkeypatch.setattr(adapters.etcd_keys, "READ_PAGE", 2)  # several pages, one snapshot
    loaded = new_store.load()
    assert loaded == expected
    assert (loaded.policy, loaded.next_order_id, len(loaded.nodes)) == ("reactive-heat", 9, 2)
    assert [o.order_id for o in loaded.orders if not o.state.terminal] == ["o-00000001", "o-00000007", "o-00000008"]
    new_store.policy_set("predictive")
    assert old_store.load().policy == "predictive"  # anyone reads it


def test_etcd_dying_steps_the_leader_down_and_fails_writes_with_unavailable(fresh_etcd, cluster):
    elector = EtcdElector(EtcdKeys(fresh_etcd.endpoint, timeout_s=0.3), cluster, "a", "", lease_s=LEASE_S)
    elector.start()
    try:
        wait_for(lambda: elector.current().is_leader, "a leads")
        store = EtcdStateStore(EtcdKeys(fresh_etcd.endpoint, timeout_s=0.3, read_timeout_s=1.0), cluster)
        store.fence(elector.current().epoch)
        store.policy_set("reactive-heat")
        fresh_etcd.kill()
        wait_for(lambda: not elector.current().is_leader, "the leader steps down")
        with pytest.raises(Unavailable, match="etcd at"):
            store.policy_set("oracle")
        with pytest.raises(Unavailable, match="etcd at"):
            store.load()
    finally:
        elector.stop()


def test_keys_under_other_prefixes_are_not_the_states(etcd_server, cluster):
    keys = EtcdKeys(etcd_server.endpoint)
    lease, _ = keys.grant(LEASE_S)
    epoch = keys.campaign(leader_key(cluster), b"{}", lease).holder.create_revision
    assert keys.write_fenced(leader_key(cluster), epoch, {state_prefix(cluster) + "meta/policy": b"oracle",
                                                          state_prefix(cluster + "x") + "meta/policy": b"none"}, [])
    store = EtcdStateStore(keys, cluster)
    assert store.load().policy == "oracle"
    keys.revoke(lease)
