"""EtcdElector: the Elector of scheduler replicas, etcd's election recipe
(campaign.ElectionCore) run on one daemon thread.

The thread runs a round every lease TTL/3 (sooner when the lead's
valid-until comes first) and tells the listeners each time `current()`
changes. stop() resigns a leader (its lease is revoked, so a follower
takes over within a round rather than a TTL); stop(resign=False) leaves
the lease to expire, as a killed process would (tests, chaos).

With a `watch` (keys.LeaderKeyWatch; EtcdKeys is one), a second daemon
thread watches the leader key and wakes the round at once when it changes:
a follower campaigns as soon as a dead leader's key is deleted (failover
about one TTL after the leader's last keep-alive, instead of up to a round
more) and learns a new leader as soon as its key is put. The rounds every
TTL/3 stay: they keep this replica's own lease alive (a leader's lead, and a
follower's lease ready to campaign with), and a follower's look at the key
in each is the safety net should the watch miss or lag. A wake-up only
brings a round forward; the lead's valid-until, counted on this replica's
own clock from a round's start, is untouched, so the step-down rule and the
fencing are as without a watch.

The keys it is given decide where it runs: adapters/etcd_keys.EtcdKeys for a
real etcd, memory_keys.MemoryKeys in one process (no watch).
"""
from __future__ import annotations

import logging
import threading

from speckv.services.common.clock import Clock, SystemClock
from speckv.services.scheduler.leadership.campaign import ElectionCore
from speckv.services.scheduler.leadership.elector import Leadership, LeadershipListener, notify
from speckv.services.scheduler.leadership.keys import LeaderKeyStore, LeaderKeyWatch, leader_key

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 2


class EtcdElector:
    """One replica's Elector over `keys` for cluster's leader key
    (/speckv/<cluster>/leader). replica_id names it (unique per replica);
    address is where its scheduler answers (followers tell routers and
    peers); lease_s: the lease TTL in whole seconds (failover < 2 of them)."""

    def __init__(self, keys: LeaderKeyStore, cluster: str, replica_id: str, address: str,
                 lease_s: int = DEFAULT_LEASE_S, clock: Clock | None = None,
                 watch: LeaderKeyWatch | None = None) -> None:
        self._core = ElectionCore(keys, leader_key(cluster), replica_id, address, lease_s, clock or SystemClock())
        self._watch = watch
        self._watch_thread: threading.Thread | None = None
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
        if self._watch is not None and (self._watch_thread is None or not self._watch_thread.is_alive()):
            # Not joined on stop: it returns within the watch's idle bound, and a late wake-up is a no-op.
            self._watch_thread = threading.Thread(target=self._watch_key, args=(self._watch,),
                                                  name=f"elector-watch-{self._core.replica_id}", daemon=True)
            self._watch_thread.start()

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
            self._wake.clear()  # before the round: a change seen during it brings the next one forward
            try:
                delay = self._core.step()
            except Exception:  # noqa: BLE001 - a bug in one round must not end the election; logged
                log.exception("election round of %s failed", self._core.replica_id)
                delay = self._core.round_s()
            self._tell_if_changed()
            self._wake.wait(delay)

    def _watch_key(self, watch: LeaderKeyWatch) -> None:
        try:
            watch.watch(self._core.key, self._wake.set, self._stopping)
        except Exception:  # noqa: BLE001 - the rounds go on without it (they look at the key themselves)
            log.exception("watch of %s by %s failed; following by rounds only", self._core.key,
                          self._core.replica_id)

    def _tell_if_changed(self) -> None:
        with self._listeners_lock:
            now = self._core.current()
            if now == self._told:
                return
            self._told = now
            for listener in list(self._listeners):
                notify(listener, now)
