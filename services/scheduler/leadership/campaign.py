"""The election's state machine (etcd's recipe), one round per `step()`, on
an injected clock and a LeaderKeyStore; no threads (etcd_elector.py runs it).

Algorithm, each round (every lease_ttl/3 seconds):
1. Keep this replica's lease alive (grant one when it has none). The round's
   start time `sent` bounds when the server refreshed it, so the lease lives
   on the server at least until sent + TTL: the replica's lead is valid until
   sent + STEP_DOWN_AT * TTL by its own clock (0.75: a quarter of the TTL
   of margin for clock rates and the request's own time).
2. Campaign: one txn creates the leader key on the lease if it is absent and
   reads it back. The key on our lease => we lead, epoch = its
   create_revision; anyone else's => we follow it (and step down if we led).
A leader steps down at once, before its lease can have expired on the
server, when: its lease is gone (keep-alive says TTL <= 0), the key is no
longer on its lease, or its valid-until passes without a successful
keep-alive (etcd unreachable). It then forgets that lease, so it never
claims that epoch again: a later lead is a new key with a larger epoch.
`current()` applies the valid-until lazily, so it is right even while a
round is blocked on the network.

Failover: a dead leader's key goes with its lease (<= TTL after its last
keep-alive); a follower campaigns within TTL/3 of that: < 2 TTL in all.
`resign()` revokes the lease (the key goes now) and holds this replica off
campaigning for one TTL, so another takes over.
"""
from __future__ import annotations

import json
import logging
import threading

from speckv.services.common.clock import Clock
from speckv.services.common.errors import Unavailable
from speckv.services.scheduler.leadership.elector import NO_LEADER, Leadership
from speckv.services.scheduler.leadership.keys import CampaignResult, KeyRecord, LeaderKeyStore, LeaseId

log = logging.getLogger(__name__)

STEP_DOWN_AT = 0.75  # of the lease TTL past a keep-alive's start: when the lead stops being trusted
ROUNDS_PER_TTL = 3  # keep-alives (and a follower's looks at the key) per lease TTL
MIN_LEASE_S = 1


def encode_holder(replica_id: str, address: str) -> bytes:
    return json.dumps({"id": replica_id, "address": address}, sort_keys=True).encode()


def decode_holder(value: bytes) -> tuple[str, str]:
    """(replica id, address) of a leader key's value; ("", "") when it is not ours to read."""
    try:
        doc = json.loads(value)
        return str(doc["id"]), str(doc["address"])
    except (ValueError, TypeError, KeyError):
        return "", ""


class ElectionCore:
    """One replica's part in the election of one leader key. `step()` and
    `resign()`/`close()` are serialised by a lock (they do I/O); `current()`
    reads a published snapshot and does none."""

    def __init__(self, keys: LeaderKeyStore, key: str, replica_id: str, address: str, lease_s: int,
                 clock: Clock) -> None:
        if lease_s < MIN_LEASE_S:
            raise ValueError(f"lease of {lease_s} s: etcd leases are whole seconds, >= {MIN_LEASE_S}")
        if not replica_id:
            raise ValueError("a replica id is needed (it names the leader)")
        self.key, self.replica_id, self.address, self.lease_s = key, replica_id, address, lease_s
        self._keys, self._clock = keys, clock
        self._value = encode_holder(replica_id, address)
        self._io = threading.Lock()
        self._lease: LeaseId | None = None
        self._ttl = lease_s  # the TTL the server granted our lease
        self._lease_valid_until = 0.0
        self._holdoff_until = float("-inf")
        # (Leadership, valid until): replaced whole, read without a lock.
        self._view: tuple[Leadership, float] = (NO_LEADER, float("inf"))

    # --- reading -------------------------------------------------------------
    def current(self) -> Leadership:
        leadership, until = self._view
        if leadership.is_leader and self._clock.now() >= until:
            return Leadership(False, leadership.epoch, leadership.leader_id, leadership.leader_address)
        return leadership

    def round_s(self) -> float:
        """Seconds between rounds."""
        return self._ttl / ROUNDS_PER_TTL

    # --- one round -----------------------------------------------------------
    def step(self) -> float:
        """One round; the seconds until the next is due (sooner than a round
        when the lead's valid-until comes first, so its end is noticed)."""
        with self._io:
            self._expire_lead()
            try:
                sent = self._clock.now()
                self._refresh_lease(sent)
                assert self._lease is not None
                if self._clock.now() < self._holdoff_until:
                    self._settle(CampaignResult(False, self._keys.read(self.key)))
                else:
                    self._settle(self._keys.campaign(self.key, self._value, self._lease))
            except Unavailable as exc:
                log.warning("election %s: etcd unreachable (%s)", self.key, exc)
                self._expire_lead()
            return self._next_delay()

    def resign(self) -> None:
        """Leader: revoke the lease (the key goes with it), follow, and hold
        off campaigning for one TTL. Follower: nothing."""
        with self._io:
            if not self._view[0].is_leader:
                return
            self._drop_lease(revoke=True)
            self._holdoff_until = self._clock.now() + self._ttl
            self._publish(NO_LEADER, float("inf"))
            log.info("election %s: %s resigned", self.key, self.replica_id)

    def close(self, revoke: bool = True) -> None:
        """Leaves the election: revokes this replica's lease (revoke=False:
        leaves it to expire, as a crash would) and publishes no leader."""
        with self._io:
            self._drop_lease(revoke=revoke)
            self._publish(NO_LEADER, float("inf"))

    # --- the round's parts ---------------------------------------------------
    def _refresh_lease(self, sent: float) -> None:
        if self._lease is not None:
            ttl = self._keys.keep_alive(self._lease)
            if ttl > 0:
                self._lease_valid_until = sent + ttl * STEP_DOWN_AT
                return
            log.warning("election %s: lease %x of %s is gone on the server", self.key, self._lease, self.replica_id)
            self._lease = None
            self._step_down("its lease expired")
        self._lease, self._ttl = self._keys.grant(self.lease_s)
        self._lease_valid_until = sent + self._ttl * STEP_DOWN_AT

    def _settle(self, result: CampaignResult) -> None:
        holder = result.holder
        if holder is not None and self._lease is not None and holder.lease == self._lease:
            was = self._view[0]
            self._publish(Leadership(True, holder.create_revision, self.replica_id, self.address),
                          self._lease_valid_until)
            if not (was.is_leader and was.epoch == holder.create_revision):
                log.info("election %s: %s leads at epoch %d", self.key, self.replica_id, holder.create_revision)
            return
        if self._view[0].is_leader:
            self._step_down("the leader key is no longer on its lease")
        self._publish(_follower_view(holder), float("inf"))

    def _expire_lead(self) -> None:
        """Steps down when the lead's valid-until has passed."""
        leadership, until = self._view
        if leadership.is_leader and self._clock.now() >= until:
            self._step_down("no keep-alive succeeded in time")

    def _step_down(self, why: str) -> None:
        """Follow now and forget the lease: this leadership's epoch is never claimed again."""
        leadership = self._view[0]
        if not leadership.is_leader:
            return
        log.warning("election %s: %s steps down from epoch %d: %s", self.key, self.replica_id, leadership.epoch, why)
        self._lease = None
        self._publish(Leadership(False, leadership.epoch, "", ""), float("inf"))

    def _drop_lease(self, revoke: bool) -> None:
        lease, self._lease = self._lease, None
        if lease is None or not revoke:
            return
        try:
            self._keys.revoke(lease)
        except Unavailable as exc:  # it expires on its own within a TTL
            log.warning("election %s: could not revoke lease %x: %s", self.key, lease, exc)

    def _publish(self, leadership: Leadership, until: float) -> None:
        self._view = (leadership, until)

    def _next_delay(self) -> float:
        delay = self.round_s()
        leadership, until = self._view
        if leadership.is_leader:
            delay = min(delay, until - self._clock.now())
        return max(delay, 0.0)


def _follower_view(holder: KeyRecord | None) -> Leadership:
    if holder is None:
        return NO_LEADER
    replica_id, address = decode_holder(holder.value)
    return Leadership(False, holder.create_revision, replica_id, address)
