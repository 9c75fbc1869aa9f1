"""Followers watch the leader key (EtcdElector with watch=EtcdKeys) on a
real etcd: with rounds 20 s apart (a 60 s lease), a leader key deleted
(its lease revoked) is replaced by a new lead, at a larger epoch, that both
replicas agree on well before any round could have seen the deletion; the watch carries on across a killed etcd member, resuming on the
next one without missing the deletion."""
from __future__ import annotations

import time
import uuid

from speckv.services.scheduler.leadership.adapters.etcd_keys import EtcdKeys
from speckv.services.scheduler.leadership.etcd_elector import EtcdElector
from speckv.services.scheduler.leadership.keys import leader_key
from tests.support.etcd import etcd_cluster, etcd_server  # noqa: F401 - fixtures
from tests.support import waiting

LEASE_S = 60  # rounds every 20 s: only the watch can explain a take-over within WITHIN_S
WITHIN_S = 10.0


def wait_for(predicate, what, within=WITHIN_S):
    waiting.wait_for(predicate, what, within)


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


def new_lead_agreed(electors, epoch) -> bool:
    """One of them leads at an epoch past `epoch` and both name it (either may win the new campaign: both
    were woken by the deletion)."""
    views = [e.current() for e in electors]
    leaders = [v for v in views if v.is_leader and v.epoch > epoch]
    return len(leaders) == 1 and all(v.leader_id == leaders[0].leader_id for v in views)


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
        # Woken by the deletion, the follower campaigns and the deposed leader finds its lease gone, steps down
        # and campaigns too; woken by the new key, the loser learns who leads. No round is due for 20 s.
        wait_for(lambda: new_lead_agreed((leader, follower), epoch), "a new lead both replicas agree on")
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
        wait_for(lambda: new_lead_agreed((leader, follower), epoch), "a new lead, seen through another member")
    finally:
        leader.stop(resign=False)
        follower.stop(resign=False)
