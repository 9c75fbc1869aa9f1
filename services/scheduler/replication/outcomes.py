"""What each speculative action came to, per policy and action kind.

Every order issued is followed until it has an outcome:
- used in time: after it committed and before its lease ended, a request
  of its family was routed to its node (the target of a replica, the holder
  of a prefetch) with a cached prefix there;
- used late: a request of its family was routed while the order was still
  ISSUED or IN_FLIGHT (it had to go without it), the order then landed, and
  none used it in time;
- never used: committed, and its lease ended with no use (and not late);
- cancelled: cancelled before it started; failed: FAILED or EXPIRED before
  it landed.
Each outcome counts the order's bytes (network bytes of a replica, counted
when it is issued; the bytes a prefetch promoted or a retain protected,
counted when it commits, as its prefix may be partly in the device tier
already or beyond the retention cap) and the saving the planner expected when it
issued it (`expected_benefit_ms`), so a report can set what was expected
beside what was used. An order's record is dropped once it has its outcome,
so memory is bounded by the orders still active or leased; totals are kept
for at most MAX_POLICIES policy names (an order names its policy, and
SubmitOrder takes any), the rest under "other". A retry is an order of its
own whose expected saving is zero: its original carried it.

Not thread-safe: SchedulerCore serialises access. Times are clock seconds.
"""
from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass, field

from speckv.services.common.ids import Family, NodeId, OrderId
from speckv.services.scheduler.replication.orders import ActionKind, Order, OrderState

MAX_POLICIES = 64


class Outcome(enum.Enum):
    USED_IN_TIME = "used_in_time"
    USED_LATE = "used_late"
    NEVER_USED = "never_used"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass(slots=True)
class ActionStats:
    """Totals of one (policy, action kind)."""

    orders: int = 0
    bytes: int = 0
    expected_ms: float = 0.0  # sum of the planner's expected saving at issue
    outcomes: dict[str, int] = field(default_factory=lambda: {o.value: 0 for o in Outcome})
    bytes_by_outcome: dict[str, int] = field(default_factory=lambda: {o.value: 0 for o in Outcome})
    expected_ms_by_outcome: dict[str, float] = field(default_factory=lambda: {o.value: 0.0 for o in Outcome})

    @property
    def used_in_time_share(self) -> float | None:
        """Of the orders with an outcome, the share used in time."""
        decided = sum(self.outcomes.values())
        return self.outcomes[Outcome.USED_IN_TIME.value] / decided if decided else None

    @property
    def bytes_used_in_time_share(self) -> float | None:
        """Of the bytes of orders with an outcome, the share read in time."""
        decided = sum(self.bytes_by_outcome.values())
        return self.bytes_by_outcome[Outcome.USED_IN_TIME.value] / decided if decided else None

    def to_json(self) -> dict[str, object]:
        return {"orders": self.orders, "bytes": self.bytes, "expected_ms": self.expected_ms,
                "outcomes": dict(self.outcomes), "bytes_by_outcome": dict(self.bytes_by_outcome),
                "expected_ms_by_outcome": dict(self.expected_ms_by_outcome),
                "used_in_time_share": self.used_in_time_share,
                "bytes_used_in_time_share": self.bytes_used_in_time_share}


@dataclass(slots=True)
class _Tracked:
    key: tuple[str, ActionKind]
    family: Family
    node: NodeId
    nbytes: int
    bytes_per_block: int
    expected_ms: float
    lease_s: float
    lease_end: float | None = None  # set when it commits
    late: bool = False


class ActionOutcomes:
    def __init__(self) -> None:
        self._tracked: dict[OrderId, _Tracked] = {}
        self._by_family: dict[Family, set[OrderId]] = defaultdict(set)
        self._stats: dict[tuple[str, ActionKind], ActionStats] = defaultdict(ActionStats)
        self._policies: set[str] = set()

    def issued(self, order: Order, bytes_per_block: int) -> None:
        spec = order.spec
        policy = spec.policy if spec.policy in self._policies or len(self._policies) < MAX_POLICIES else "other"
        self._policies.add(policy)
        key = (policy, spec.action)
        nbytes = len(spec.block_hashes) * bytes_per_block if spec.action.copies else 0
        stats = self._stats[key]
        stats.orders += 1
        stats.bytes += nbytes
        stats.expected_ms += spec.expected_benefit_ms
        self._tracked[order.order_id] = _Tracked(key, spec.family, spec.target, nbytes, bytes_per_block,
                                                 spec.expected_benefit_ms, spec.lease_ms / 1e3)
        self._by_family[spec.family].add(order.order_id)

    def transition(self, order: Order, now: float) -> None:
        """The order reached order.state."""
        tracked = self._tracked.get(order.order_id)
        if tracked is None or tracked.lease_end is not None:
            return
        if order.state is OrderState.COMMITTED:
            tracked.lease_end = now + tracked.lease_s
            if not order.spec.action.copies:  # promoted or retained, as reported
                tracked.nbytes = order.blocks_sent * tracked.bytes_per_block
                self._stats[tracked.key].bytes += tracked.nbytes
        elif order.state is OrderState.CANCELLED:
            self._close(order.order_id, Outcome.CANCELLED)
        elif order.state in (OrderState.FAILED, OrderState.EXPIRED):
            self._close(order.order_id, Outcome.FAILED)

    def routed(self, family: Family, node: NodeId, cached: bool, now: float) -> None:
        """A request of family went to node (cached: it found a prefix there)."""
        ids = self._by_family.get(family)
        if not ids:
            return
        for order_id in list(ids):
            tracked = self._tracked[order_id]
            if tracked.lease_end is None:
                tracked.late = True
            elif cached and tracked.node == node and now <= tracked.lease_end:
                self._close(order_id, Outcome.USED_IN_TIME)

    def sweep(self, now: float) -> None:
        """Closes the committed actions whose lease is over."""
        over = [i for i, t in self._tracked.items() if t.lease_end is not None and t.lease_end < now]
        for order_id in over:
            self._close(order_id, Outcome.USED_LATE if self._tracked[order_id].late else Outcome.NEVER_USED)

    def stats(self) -> dict[tuple[str, ActionKind], ActionStats]:
        return dict(self._stats)

    def _close(self, order_id: OrderId, outcome: Outcome) -> None:
        tracked = self._tracked.pop(order_id)
        ids = self._by_family[tracked.family]
        ids.discard(order_id)
        if not ids:
            del self._by_family[tracked.family]
        stats = self._stats[tracked.key]
        stats.outcomes[outcome.value] += 1
        stats.bytes_by_outcome[outcome.value] += tracked.nbytes
        stats.expected_ms_by_outcome[outcome.value] += tracked.expected_ms
