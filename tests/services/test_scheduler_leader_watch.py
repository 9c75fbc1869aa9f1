"""Followers watch the leader key (EtcdElector with watch=EtcdKeys) on a
real etcd: with rounds 20 s apart (a 60 s lease), a leader key deleted
(its lease revoked) is taken over by a follower well before any round
could have seen it, and the old leader, woken by the same change, steps
down; the watch carries on across a killed etcd member, resuming on the
next one without missing the deletion."""
from __future__ import annotations

import time
import uuid

import pytest

from speckv.services.scheduler.leadership.adapters.etcd_keys import EtcdKeys
from speckv.services.scheduler.leadership.etcd_elector import EtcdElector
from speckv.services.scheduler.leadership.keys import leader_key
from tests.support.etcd import etcd_cluster, etcd_server  # noqa: F401 - fixtures

LEASE_S = 60  # rounds every 20 s: only the watch can explain a take-over within WITHIN_S
WITHIN_S = 10.0


def wait_for(predicate, what, within=WITHIN_S):
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {within} s: {what}")
        time.sleep(0.02)


def start_pair(endpoints):
    cluster = f"t-{uuid.uuid4().hex[:8]}"
    electors = []
    for name in ("a", "b"):
        keys = EtcdKeys(endpoints, timeout_s=0.5)
        elector = EtcdElector(keys, cluster, name, f"{name}:50051", lease_s=LEASE_S, watch=keys)
        elector.start()
        electors.append(elector)
    wait_for(lambda: sum(e.current().is_leader for e in electors) == 1, "one leader", within=60.0)
    leader = next(e for e in electors if e.current().is_leader)
    return cluster, leader, next(e for e in electors if e is not leader)


def depose(endpoints, cluster):
    """Revokes the lease the leader key lives on (its key goes with it), as an expiry would."""
    keys = EtcdKeys(endpoints, timeout_s=2.0)
    keys.revoke(keys.read(leader_key(cluster)).lease)


def test_a_deleted_leader_key_is_taken_over_at_once_not_at_the_next_round(etcd_server):  # noqa: F811
    cluster, leader, follower = start_pair(etcd_server.endpoint)
    try:
        epoch = leader.current().epoch
        time.sleep(1.0)  # both are now waiting out a 20 s round
        depose(etcd_server.endpoint, cluster)
        wait_for(lambda: follower.current().is_leader, "the follower takes over")
        assert follower.current().epoch > epoch
        wait_for(lambda: not leader.current().is_leader, "the deposed leader steps down")
        assert leader.current().leader_id == follower.replica_id
    finally:
        leader.stop()
        follower.stop()


def test_the_watch_resumes_on_another_member_when_its_member_dies(etcd_cluster):  # noqa: F811
    endpoints = [m.endpoint for m in etcd_cluster.members]
    cluster, leader, follower = start_pair(endpoints)
    try:
        epoch = leader.current().epoch
        etcd_cluster.members[0].kill()  # the member every client asked first, the watches' too
        time.sleep(1.0)
        depose(endpoints[1:], cluster)
        wait_for(lambda: follower.current().is_leader, "the follower takes over through another member")
        assert follower.current().epoch > epoch
    finally:
        leader.stop(resign=False)
        follower.stop(resign=False)
