"""A scheduler replica's duties as its leadership changes (adapter).

The elector (leadership/) says who leads; LeaderDuties makes this replica's
core act on it, on the elector's thread, one change at a time:

- elected at epoch e: fence the shared state store at e, load it, and take
  the orders and policy over (SchedulerCore.take_over); only then does this
  replica count as leading (`current().is_leader`): its ticker plans and its
  servicer streams orders at e, never before the adopted log is in place
  (a plan before it would number orders from 0, over the old leader's ids);
- deposed (or lost etcd): fence the store at 0 (every write refused), stop
  counting as leading at once, and forget the orders (SchedulerCore.step_down);
- a take-over that fails (etcd gone between the election and the load)
  resigns, so another replica can lead, and this one stays a follower.

ReplicaJournal is the core's StateJournal on a replica: the shared store's
calls while this replica leads, nothing while it follows (every replica
takes the kvstores' registrations; only the leader records them, and the
store would refuse the others' writes anyway).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Sequence

from speckv.services.common.errors import SpeckvError
from speckv.services.common.ids import OrderId
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.leadership.elector import NO_LEADER, Elector, Leadership
from speckv.services.scheduler.leadership.state_store import EtcdStateStore
from speckv.services.scheduler.orders import Order
from speckv.services.scheduler.ports import SavedNode

log = logging.getLogger(__name__)


class LeaderDuties:
    def __init__(self, store: EtcdStateStore) -> None:
        self._elector: Elector | None = None
        self._store = store
        self._core: SchedulerCore | None = None
        self._lock = threading.Lock()
        self._leading_epoch = 0  # the epoch whose take-over completed; 0: following
        self.take_overs = 0
        self.step_downs = 0

    def attach(self, core: SchedulerCore, elector: Elector) -> None:
        """The core to act on and the elector to follow; before the elector starts."""
        self._core, self._elector = core, elector
        elector.on_change(self.changed)

    def current(self) -> Leadership:
        """The elector's view, leading only once the take-over completed (NO_LEADER before attach)."""
        if self._elector is None:
            return NO_LEADER
        now = self._elector.current()
        with self._lock:
            leading = now.is_leader and self._leading_epoch == now.epoch
        return replace(now, is_leader=leading)

    def leading(self) -> bool:
        with self._lock:
            return self._leading_epoch != 0

    def changed(self, leadership: Leadership) -> None:
        if leadership.is_leader:
            with self._lock:
                if self._leading_epoch == leadership.epoch:
                    return
            self._take_over(leadership.epoch)
        else:
            self._step_down()

    def _take_over(self, epoch: int) -> None:
        assert self._core is not None and self._elector is not None, "attach() first"
        try:
            self._store.fence(epoch)
            saved = self._store.load()
            self._core.take_over(saved)
        except SpeckvError as exc:
            log.warning("elected at epoch %d but could not take the shared state over (%s); resigning", epoch, exc)
            self._store.fence(0)
            self._elector.resign()
            return
        with self._lock:
            self._leading_epoch = epoch
        self.take_overs += 1
        log.info("this replica leads at epoch %d", epoch)

    def _step_down(self) -> None:
        with self._lock:
            was, self._leading_epoch = self._leading_epoch, 0
        self._store.fence(0)
        if was and self._core is not None:
            self._core.step_down()
            self.step_downs += 1
            log.info("this replica no longer leads (it led at epoch %d)", was)

    def stop(self) -> None:
        """Leaves the election (a leader resigns: another takes over at once)."""
        if self._elector is not None:
            self._elector.stop()
        self.changed(NO_LEADER)


class ReplicaJournal:
    """The module docstring's journal: the store's writes while leading only."""

    def __init__(self, store: EtcdStateStore, duties: LeaderDuties) -> None:
        self._store, self._duties = store, duties

    def policy_set(self, name: str) -> None:
        if self._duties.leading():
            self._store.policy_set(name)

    def node_registered(self, node: SavedNode) -> None:
        if self._duties.leading():
            self._store.node_registered(node)

    def order_issued(self, order: Order, next_id: int) -> None:
        if self._duties.leading():
            self._store.order_issued(order, next_id)

    def order_changed(self, order: Order, evicted: Sequence[OrderId]) -> None:
        if self._duties.leading():
            self._store.order_changed(order, evicted)
