"""What this scheduler process may do as one of several replicas (adapter).

Every replica answers Route, takes registrations and heartbeats and follows
every kvstore's events; only the leader plans, issues, streams and takes
reports of orders, and changes the policy. ReplicaRole reads who leads from
the elector (services/scheduler/leadership/) and says it on every reply that
carries a Leadership, so kvstores learn a new leader's epoch (their fence)
from the next heartbeat, before any of its orders.

Without an elector the process is the one scheduler: it leads, at epoch 0
(unfenced), and says no leader id.
"""
from __future__ import annotations

from typing import Protocol

from speckv.services.common.errors import NOT_LEADING, FailedPrecondition
from speckv.services.scheduler.leadership.elector import Leadership
from speckv.v1 import scheduler_pb2


class LeadershipSource(Protocol):
    def current(self) -> Leadership: ...


class ReplicaRole:
    def __init__(self, elector: LeadershipSource | None = None) -> None:
        self._elector = elector

    @property
    def replicated(self) -> bool:
        return self._elector is not None

    def is_leader(self) -> bool:
        return self._elector is None or self._elector.current().is_leader

    def epoch(self) -> int:
        """The fencing token to stamp on orders sent now (0 without election)."""
        return 0 if self._elector is None else self._elector.current().epoch

    def leadership_proto(self) -> scheduler_pb2.Leadership:
        if self._elector is None:
            return scheduler_pb2.Leadership(answering_is_leader=True)
        now = self._elector.current()
        return scheduler_pb2.Leadership(epoch=now.epoch, leader_id=now.leader_id or "",
                                        leader_address=now.leader_address or "", answering_is_leader=now.is_leader)

    def require_leader(self, what: str) -> None:
        """FailedPrecondition naming the leader, unless this replica leads."""
        if self._elector is None:
            return
        now = self._elector.current()
        if not now.is_leader:
            where = f"{now.leader_id} at {now.leader_address}" if now.leader_id else "not known now (an election runs)"
            raise FailedPrecondition(f"{what}: {NOT_LEADING}; the leader is {where}")
