"""EtcdElector: the Elector of scheduler replicas, etcd's election recipe
(campaign.ElectionCore) run on one daemon thread.

The thread runs a round every lease TTL/3 (sooner when the lead's
valid-until comes first) and tells the listeners each time `current()`
changes. stop() resigns a leader (its lease is revoked, so a follower
takes over within a round rather than a TTL); stop(resign=False) leaves
the lease to expire, as a killed process would (tests, chaos).

The keys it is given decide where it runs: adapters/etcd_keys.EtcdKeys for a
real etcd, memory_keys.MemoryKeys in one process.
"""
from __future__ import annotations

import logging
import threading

from speckv.services.common.clock import Clock, SystemClock
from speckv.services.scheduler.leadership.campaign import ElectionCore
from speckv.services.scheduler.leadership.elector import Leadership, LeadershipListener, notify
from speckv.services.scheduler.leadership.keys import LeaderKeyStore, leader_key

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 2


class EtcdElector:
    """One replica's Elector over `keys` for cluster's leader key
    (/speckv/<cluster>/leader). replica_id names it (unique per replica);
    address is where its scheduler answers (followers tell routers and
    peers); lease_s: the lease TTL in whole seconds (failover < 2 of them)."""

    def __init__(self, keys: LeaderKeyStore, cluster: str, replica_id: str, address: str,
                 lease_s: int = DEFAULT_LEASE_S, clock: Clock | None = None) -> None:
        self._core = ElectionCore(keys, leader_key(cluster), replica_id, address, lease_s, clock or SystemClock())
        self._listeners: list[LeadershipListener] = []
        # Held while telling (listeners included), so they hear changes in order, one at a time.
        self._listeners_lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._told = self._core.current()

    @property
    def replica_id(self) -> str:
        return self._core.replica_id

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=f"elector-{self._core.replica_id}", daemon=True)
        self._thread.start()

    def stop(self, resign: bool = True) -> None:
        """Stops the thread, then leaves the election: resign=True revokes
        the lease (a leader's successor takes over at once), False leaves it
        to expire (as a crash would)."""
        thread, self._thread = self._thread, None
        self._stopping.set()
        self._wake.set()
        if thread is not None:
            thread.join()
        self._core.close(revoke=resign)
        self._tell_if_changed()

    def current(self) -> Leadership:
        return self._core.current()

    def resign(self) -> None:
        self._core.resign()
        self._tell_if_changed()
        self._wake.set()

    def on_change(self, listener: LeadershipListener) -> None:
        with self._listeners_lock:
            self._listeners.append(listener)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                delay = self._core.step()
            except Exception:  # noqa: BLE001 - a bug in one round must not end the election; logged
                log.exception("election round of %s failed", self._core.replica_id)
                delay = self._core.round_s()
            self._tell_if_changed()
            self._wake.wait(delay)
            self._wake.clear()

    def _tell_if_changed(self) -> None:
        with self._listeners_lock:
            now = self._core.current()
            if now == self._told:
                return
            self._told = now
            for listener in list(self._listeners):
                notify(listener, now)
