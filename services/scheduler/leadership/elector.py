"""Who plans: the Leadership a replica holds now, and the Elector interface
that decides it (a strategy object: SoleElector for one process,
etcd_elector.EtcdElector for replicas).

Invariants every Elector keeps:
- epoch is a fencing token: each leadership a cluster ever grants has a
  strictly larger epoch than every earlier one; 0 means no leader is known.
- `current()` is cheap (no I/O) and never says is_leader after the moment
  this replica may have lost the lead: the scheduler gates planning and
  order issue on it at each use.
- on_change callbacks hear each change of the Leadership value once, in
  order, on the elector's thread (or the one calling resign/stop), never
  under the lock that guards the election; a callback that raises is
  logged and does not stop the elector.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Leadership:
    """is_leader: this replica leads now. epoch, leader_id, leader_address:
    the leadership known (this replica's when it leads; the one it last saw
    otherwise; 0 and "" when none is known)."""

    is_leader: bool
    epoch: int
    leader_id: str
    leader_address: str


NO_LEADER = Leadership(False, 0, "", "")

LeadershipListener = Callable[[Leadership], None]


class Elector(Protocol):
    def start(self) -> None:
        """Starts taking part (campaigning, following). Idempotent."""
        ...

    def stop(self) -> None:
        """Stops taking part; a leader resigns first, so another takes over
        at once. After it, current() is not leading. Idempotent."""
        ...

    def current(self) -> Leadership: ...

    def resign(self) -> None:
        """A leader gives the lead up now (and does not campaign again for a
        lease period, so another replica can take it); a follower: no-op."""
        ...

    def on_change(self, listener: LeadershipListener) -> None:
        """Calls listener with each new Leadership from now on."""
        ...


class SoleElector:
    """One process, no coordination: the leader from start() to stop(), at
    the epoch given (the single-process scheduler's default). resign() is a
    no-op: there is no one to hand the lead to. Listeners hear start and
    stop, on the caller's thread."""

    __slots__ = ("_leadership", "_started", "_listeners")

    def __init__(self, replica_id: str, address: str = "", epoch: int = 1) -> None:
        if epoch <= 0:
            raise ValueError(f"epoch {epoch}: a leader's epoch is > 0")
        self._leadership = Leadership(True, epoch, replica_id, address)
        self._started = False
        self._listeners: list[LeadershipListener] = []

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._tell(self._leadership)

    def stop(self) -> None:
        if self._started:
            self._started = False
            self._tell(NO_LEADER)

    def current(self) -> Leadership:
        return self._leadership if self._started else NO_LEADER

    def resign(self) -> None:
        return None

    def on_change(self, listener: LeadershipListener) -> None:
        self._listeners.append(listener)

    def _tell(self, leadership: Leadership) -> None:
        for listener in list(self._listeners):
            notify(listener, leadership)


def notify(listener: LeadershipListener, leadership: Leadership) -> None:
    """Calls listener; what it raises is logged, never propagated (an
    elector outlives a faulty listener)."""
    try:
        listener(leadership)
    except Exception:  # noqa: BLE001 - a listener's bug must not stop the election
        log.exception("a leadership listener failed on %s", leadership)
