"""EtcdStateStore on etcd's semantics in memory (MemoryKeys): it loads
exactly what the SQLite store loads after the same journal calls, every
write is fenced by the leader key's epoch, eviction deletes, damaged keys
are refused at load. The same against a real etcd: tests/services/
test_scheduler_leadership.py."""
from __future__ import annotations

import base64
import json

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import FailedPrecondition, Unavailable
from speckv.services.common.geometry import KVGeometry, preset
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.adapters.state_store import StateStore
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.leadership.elector import Leadership
from speckv.services.scheduler.leadership.keys import leader_key, state_prefix
from speckv.services.scheduler.leadership.memory_keys import MemoryKeys
from speckv.services.scheduler.leadership.state_store import EtcdStateStore
from speckv.services.scheduler.orders import ActionKind, OrderSpec, OrderState, OrderTracker
from speckv.services.scheduler.ports import SavedNode, SchedulerSettings
from speckv.services.scheduler.replication.transports import Carried

CLUSTER = "c1"
GEOMETRY = KVGeometry(2, 2, 16, "float32", 4)
BIG_HASH = 2**64 - 1


def spec(source="a", target="b", hashes=(1, 2, 3), lease_ms=10_000, **kw) -> OrderSpec:
    return OrderSpec(Family("f"), list(hashes), NodeId(source), NodeId(target), lease_ms, **kw)


class Tee:
    """Hands each journal call to every store."""

    def __init__(self, *stores):
        self.stores = stores

    def __getattr__(self, name):
        return lambda *args: [getattr(s, name)(*args) for s in self.stores]


@pytest.fixture
def clock():
    return ManualClock(100.0)


@pytest.fixture
def keys(clock):
    return MemoryKeys(clock)


def lead(keys: MemoryKeys, ttl: int = 60) -> int:
    """Makes a leader key (as a campaign would) and returns its epoch."""
    lease, _ = keys.grant(ttl)
    return keys.campaign(leader_key(CLUSTER), b"{}", lease).holder.create_revision


@pytest.fixture
def store(keys):
    s = EtcdStateStore(keys, CLUSTER)
    s.fence(lead(keys))
    return s


def journal_a_history(journal, max_retained=2):
    journal.policy_set("reactive-heat")
    journal.policy_set("oracle")
    for node in (SavedNode(NodeId("b"), "h:2", NodeSizes(64, 256, 128), preset("tiny", 16)),
                 SavedNode(NodeId("a"), "h:1", NodeSizes(100), GEOMETRY),
                 SavedNode(NodeId("a"), "h:9", NodeSizes(128), GEOMETRY)):
        journal.node_registered(node)
    tracker = OrderTracker(max_retained=max_retained, journal=journal)
    first = tracker.submit(spec(hashes=(BIG_HASH, 0, 7), priority=3, expected_benefit_ms=12.5, policy="p",
                                target_address="h:2", tier=Tier.HOST), now=10.0)
    tracker.submit(spec(source="b", target="b", action=ActionKind.PREFETCH), now=11.0)
    tracker.report(first.order_id, OrderState.IN_FLIGHT, 12.0, "moving", bytes_sent=100, blocks_sent=1)
    done = [tracker.submit(spec(), now=13.0 + i) for i in range(4)]
    for order, state in zip(done, (OrderState.COMMITTED, OrderState.FAILED, OrderState.COMMITTED,
                                   OrderState.EXPIRED)):
        tracker.report(order.order_id, state, 20.0)
    journal.transports_counted([Carried("a", "b", "tcp", 2, 300), Carried("a/x", "b", "", 1, 5)])
    journal.transports_counted([Carried("a/x", "b", "", 0, 0), Carried("a/x", "b", "shm", 1, 5)])
    return tracker


def test_an_empty_cluster_loads_an_empty_state(store):
    saved = store.load()
    assert (saved.policy, saved.nodes, saved.orders, saved.next_order_id, saved.order_totals) == ("", [], [], 1, {})


def test_it_loads_exactly_what_the_sqlite_store_loads_after_the_same_calls(store, tmp_path):
    sqlite = StateStore.open(tmp_path / "state")
    journal_a_history(Tee(store, sqlite))
    mine, theirs = store.load(), sqlite.load()
    sqlite.close()
    assert mine == theirs
    assert len(mine.orders) == 4 and mine.next_order_id == 7 and mine.policy == "oracle"
    assert mine.orders[0].spec.block_hashes == [BIG_HASH, 0, 7]
    assert mine.order_totals == {OrderState.COMMITTED: 2, OrderState.FAILED: 1, OrderState.EXPIRED: 1}
    assert mine.transports == [Carried("a", "b", "tcp", 2, 300), Carried("a/x", "b", "shm", 1, 5)]


def test_the_orders_the_tracker_evicts_are_deleted(store, keys):
    journal_a_history(store, max_retained=1)
    orders = [k for k, _ in keys.read_prefix(state_prefix(CLUSTER) + "orders/")]
    assert orders == [state_prefix(CLUSTER) + f"orders/o-0000000{i}" for i in (1, 2, 6)]


def test_an_order_evicted_by_its_own_change_is_not_kept(store, keys, tmp_path):
    sqlite = StateStore.open(tmp_path / "state")
    tracker = OrderTracker(max_retained=0, journal=Tee(store, sqlite))
    order = tracker.submit(spec(), now=1.0)
    tracker.report(order.order_id, OrderState.COMMITTED, 2.0)
    assert store.load() == sqlite.load()
    assert store.load().orders == [] and store.load().order_totals == {OrderState.COMMITTED: 1}
    sqlite.close()


def test_a_store_never_fenced_writes_nothing(keys):
    lead(keys)
    store = EtcdStateStore(keys, CLUSTER)
    with pytest.raises(FailedPrecondition, match="does not lead"):
        store.policy_set("oracle")
    assert store.load().policy == ""


def test_a_deposed_leaders_write_is_refused_and_changes_nothing(store, keys, clock):
    store.policy_set("oracle")
    keys.revoke(keys.read(leader_key(CLUSTER)).lease)  # its lease ended: the key went with it
    with pytest.raises(FailedPrecondition, match="no longer leads"):
        store.policy_set("reactive-heat")
    new_epoch = lead(keys)
    with pytest.raises(FailedPrecondition, match="no longer leads"):
        store.policy_set("reactive-heat")  # another leads now
    successor = EtcdStateStore(keys, CLUSTER)
    successor.fence(new_epoch)
    successor.policy_set("predictive")
    assert store.load().policy == "predictive"


def test_a_new_leaders_counts_continue_from_the_old_ones(store, keys):
    tracker = journal_a_history(store)
    keys.revoke(keys.read(leader_key(CLUSTER)).lease)
    successor = EtcdStateStore(keys, CLUSTER)
    successor.fence(lead(keys))
    saved = successor.load()
    again = OrderTracker(max_retained=2, journal=successor)
    again.restore(saved.orders, saved.next_order_id, saved.order_totals, now=50.0)
    late = again.submit(spec(), now=51.0)
    assert late.order_id == "o-00000007"
    again.report(late.order_id, OrderState.COMMITTED, 52.0)
    reloaded = successor.load()
    assert reloaded.order_totals[OrderState.COMMITTED] == tracker.counts()[OrderState.COMMITTED] + 1
    finished = [o.order_id for o in reloaded.orders if o.state.terminal]
    assert finished[-1] == late.order_id  # the newest terminal order comes last, after the old leader's


@pytest.mark.parametrize("name, value", [
    ("nodes/x", b"not json"),
    ("nodes/x", b"[1, 2]"),
    ("orders/o-1", json.dumps(["o-1"] * 19).encode()),
    ("meta/next_order_id", b"seven"),
    ("totals/committedish", b"1"),
    ("transports/a/b/tcp", b'["a", "b", "tcp", 0, 5]'),
    ("transports/a/b/tcp", b'["a", "b", "shm", 1, 5]'),
    ("transports/a/b/TCP", b'["a", "b", "TCP", 1, 5]'),
    ("surprise", b"1"),
])
def test_a_key_that_does_not_read_back_is_refused_at_load_naming_it(store, keys, name, value):
    keys.write_fenced(leader_key(CLUSTER), store.epoch, {state_prefix(CLUSTER) + name: value}, [])
    with pytest.raises(FailedPrecondition, match=f"etcd state key {state_prefix(CLUSTER)}{name}"):
        store.load()


def test_a_newer_schema_is_refused(store, keys):
    keys.write_fenced(leader_key(CLUSTER), store.epoch, {state_prefix(CLUSTER) + "meta/schema": b"99"}, [])
    with pytest.raises(FailedPrecondition, match="schema version 99"):
        store.load()


def test_block_hashes_are_kept_as_8_byte_words(store, keys):
    OrderTracker(journal=store).submit(spec(hashes=(BIG_HASH, 1)), now=1.0)
    (_, value), = keys.read_prefix(state_prefix(CLUSTER) + "orders/")
    assert base64.b64decode(json.loads(value)[2]) == b"\xff" * 8 + b"\x01" + b"\0" * 7


class Unreachable:
    """etcd gone: every call raises Unavailable."""

    def __getattr__(self, name):
        def call(*args):
            raise Unavailable("etcd unreachable")
        return call


def test_etcd_unreachable_fails_the_cores_call_with_unavailable(clock):
    store = EtcdStateStore(Unreachable(), CLUSTER)
    store.fence(5)
    core = SchedulerCore(SchedulerSettings(), clock, get_profile("tiny"), state=store)
    with pytest.raises(Unavailable):
        core.set_policy("reactive-heat")
    assert core.get_policy().name == "none"
    with pytest.raises(Unavailable):
        store.load()


def test_a_core_resumes_from_what_another_replicas_core_journaled(store, keys, clock):
    core = SchedulerCore(SchedulerSettings(), clock, get_profile("tiny"), state=store)
    for n in "ab":
        core.register_node(n, f"h:{n}", NodeSizes(1000), None)
    core.set_policy("reactive-heat")
    issued = core.submit_order(spec("a", "b"))
    keys.revoke(keys.read(leader_key(CLUSTER)).lease)
    successor = EtcdStateStore(keys, CLUSTER)
    successor.fence(lead(keys))
    resumed = SchedulerCore(SchedulerSettings(), clock, get_profile("tiny"), state=successor)
    resumed.restore(successor.load())
    assert resumed.get_policy().name == "reactive-heat"
    assert [r.view.node_id for r in resumed.cluster_state().nodes] == ["a", "b"]
    assert resumed.get_order(issued.order_id).state is OrderState.ISSUED
    with pytest.raises(FailedPrecondition, match="no longer leads"):
        core.set_policy("none")  # the deposed core's change is refused
    assert resumed.get_policy().name == "reactive-heat"


def test_fence_from_a_leadership_writes_only_while_it_leads(keys):
    store = EtcdStateStore(keys, CLUSTER)
    epoch = lead(keys)
    store.fence_from(Leadership(True, epoch, "r1", "h:1"))
    store.policy_set("reactive-heat")
    store.fence_from(Leadership(False, epoch, "r1", "h:1"))
    with pytest.raises(FailedPrecondition, match="does not lead"):
        store.policy_set("none")
    assert store.load().policy == "reactive-heat"


def test_fence_takes_no_negative_epoch(store):
    with pytest.raises(ValueError):
        store.fence(-1)
