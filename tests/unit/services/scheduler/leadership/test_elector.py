"""The Electors: SoleElector (one process) and EtcdElector's thread over
etcd's semantics in memory on the real clock (the real etcd:
tests/services/test_scheduler_leadership.py)."""
from __future__ import annotations

import threading

import pytest

from speckv.services.common.clock import SystemClock
from speckv.services.scheduler.leadership.elector import NO_LEADER, Leadership, SoleElector
from speckv.services.scheduler.leadership.etcd_elector import EtcdElector
from speckv.services.scheduler.leadership.memory_keys import MemoryKeys
from tests.support import waiting

WAIT_S = 30.0  # generous: a round is 1/3 s; two shared cores


def wait_for(predicate, what):
    waiting.wait_for(predicate, what, WAIT_S)


def test_a_sole_elector_leads_from_start_to_stop_at_its_epoch():
    heard = []
    sole = SoleElector("r1", "h:1", epoch=7)
    sole.on_change(heard.append)
    assert sole.current() == NO_LEADER
    sole.start()
    sole.start()
    sole.resign()
    assert sole.current() == Leadership(True, 7, "r1", "h:1")
    sole.stop()
    assert sole.current() == NO_LEADER
    assert heard == [Leadership(True, 7, "r1", "h:1"), NO_LEADER]
    with pytest.raises(ValueError):
        SoleElector("r1", epoch=0)


def test_a_listener_that_raises_does_not_stop_the_others():
    heard = []
    sole = SoleElector("r1")
    sole.on_change(lambda _: 1 / 0)
    sole.on_change(heard.append)
    sole.start()
    assert heard == [Leadership(True, 1, "r1", "")]


@pytest.fixture
def pair():
    keys = MemoryKeys(SystemClock(), min_ttl_s=1)
    electors = [EtcdElector(keys, "c", f"r{i}", f"h:{i}", lease_s=1) for i in range(2)]
    yield keys, electors
    for e in electors:
        e.stop()


def test_one_of_two_leads_and_listeners_hear_each_change_in_order(pair):
    keys, (a, b) = pair
    heard = {a.replica_id: [], b.replica_id: []}
    lock = threading.Lock()
    for e in (a, b):
        e.on_change(lambda ld, e=e: (lock.acquire(), heard[e.replica_id].append(ld), lock.release()))
        e.start()
    wait_for(lambda: a.current().is_leader or b.current().is_leader, "a leader")
    leader, follower = (a, b) if a.current().is_leader else (b, a)
    wait_for(lambda: follower.current().leader_id == leader.replica_id, "the follower sees the leader")
    assert not follower.current().is_leader
    epoch = leader.current().epoch
    leader.stop()  # resigns: the follower takes over within a round
    wait_for(lambda: follower.current().is_leader, "the follower leads after the leader stops")
    assert follower.current().epoch > epoch
    with lock:
        assert heard[leader.replica_id][0] == Leadership(True, epoch, leader.replica_id, "h:" + leader.replica_id[1:])
        assert heard[leader.replica_id][-1] == NO_LEADER
        assert heard[follower.replica_id][-1].is_leader


def test_a_leader_stopped_without_resigning_is_replaced_once_its_lease_lapses(pair):
    keys, (a, b) = pair
    a.start()
    wait_for(lambda: a.current().is_leader, "a leads")
    b.start()
    wait_for(lambda: b.current().leader_id == "r0", "b follows a")
    epoch = a.current().epoch
    a.stop(resign=False)  # as if killed: its lease runs out on its own
    assert not a.current().is_leader
    wait_for(lambda: b.current().is_leader, "b leads")
    assert b.current().epoch > epoch


def test_resign_hands_over_and_the_resigner_follows(pair):
    keys, (a, b) = pair
    a.start()
    wait_for(lambda: a.current().is_leader, "a leads")
    b.start()
    a.resign()
    assert not a.current().is_leader
    wait_for(lambda: b.current().is_leader, "b leads")
    wait_for(lambda: a.current().leader_id == "r1", "a follows b")
