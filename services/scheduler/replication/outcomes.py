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
Beside its outcome, an order used late or never used is followed after its
lease: what it placed stays on its node until evicted (a replica becomes one
more holder), so the first later request of its family routed to its node
either finds a prefix there (read after its lease: its bytes count in
`bytes_read_after_lease`) or not (gone). Followed for at most AFTERLIFE_S
after the lease and for at most MAX_AFTERLIFE orders at once (the oldest go
first, counted as not read after), so memory stays bounded.
Each outcome counts the order's bytes (network bytes of a replica, counted
when it is issued; the bytes a prefetch promoted or a retain protected,
counted when it commits, as its prefix may be partly in the device tier
already or beyond the retention cap) and the saving the planner expected when it
issued it (`expected_benefit_ms`), so a report can set what was expected
beside what was used. An order's record is dropped once it has its outcome,
so memory is bounded by the orders still active or leased; totals are kept
for at most MAX_POLICIES policy names (an order names its policy, and
SubmitOrder takes any), the rest under "other". A retry is an order of its
own whose expected saving is zero: its original carried it. Each total is
also split by the forecast the order was bought for (`OrderSpec.forecast`:
burst, return, retention; "" for none), in `ActionStats.by_forecast`, so a
report can say which forecast's orders were read.

Not thread-safe: SchedulerCore serialises access. Times are clock seconds.
"""
from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass, field

from speckv.services.common.ids import Family, NodeId, OrderId
from speckv.services.scheduler.orders import ActionKind, Order, OrderState

MAX_POLICIES = 64
AFTERLIFE_S = 600.0  # how long after its lease an unread order is still followed (s)
MAX_AFTERLIFE = 100_000


class Outcome(enum.Enum):
    USED_IN_TIME = "used_in_time"
    USED_LATE = "used_late"
    NEVER_USED = "never_used"
    CANCELLED = "cancelled"
    FAILED = "failed"


OUTCOME_NAMES = tuple(o.value for o in Outcome)  # the keys of ActionStats.outcomes, in report order


@dataclass(slots=True)
class ActionStats:
    """Totals of one (policy, action kind)."""

    orders: int = 0
    bytes: int = 0
    expected_ms: float = 0.0  # sum of the planner's expected saving at issue
    outcomes: dict[str, int] = field(default_factory=lambda: {o.value: 0 for o in Outcome})
    bytes_by_outcome: dict[str, int] = field(default_factory=lambda: {o.value: 0 for o in Outcome})
    expected_ms_by_outcome: dict[str, float] = field(default_factory=lambda: {o.value: 0.0 for o in Outcome})
    read_after_lease: int = 0  # orders used late or never used whose node a later request found a prefix on
    bytes_read_after_lease: int = 0
    # The same totals per OrderSpec.forecast (one level: these hold no split of their own).
    by_forecast: dict[str, "ActionStats"] = field(default_factory=dict)

    @property
    def pending_orders(self) -> int:
        """Orders with no outcome yet (lease still running, or not yet run)."""
        return self.orders - sum(self.outcomes.values())

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

    @property
    def bytes_read_after_lease_share(self) -> float | None:
        """Of the bytes of orders with an outcome, the share read only after their lease."""
        decided = sum(self.bytes_by_outcome.values())
        return self.bytes_read_after_lease / decided if decided else None

    def to_json(self) -> dict[str, object]:
        return {"orders": self.orders, "bytes": self.bytes, "expected_ms": self.expected_ms,
                "outcomes": dict(self.outcomes), "pending_orders": self.pending_orders,
                "bytes_by_outcome": dict(self.bytes_by_outcome),
                "expected_ms_by_outcome": dict(self.expected_ms_by_outcome),
                "used_in_time_share": self.used_in_time_share,
                "bytes_used_in_time_share": self.bytes_used_in_time_share,
                "read_after_lease": self.read_after_lease, "bytes_read_after_lease": self.bytes_read_after_lease,
                "by_forecast": {kind: stats.to_json() for kind, stats in sorted(self.by_forecast.items())}}

    def copy(self) -> "ActionStats":
        """An independent copy (its maps and split copied too)."""
        return ActionStats(self.orders, self.bytes, self.expected_ms, dict(self.outcomes), dict(self.bytes_by_outcome),
                           dict(self.expected_ms_by_outcome), self.read_after_lease, self.bytes_read_after_lease,
                           {name: part.copy() for name, part in self.by_forecast.items()})

    def of_forecast(self, forecast: str) -> "ActionStats":
        stats = self.by_forecast.get(forecast)
        if stats is None:
            stats = self.by_forecast[forecast] = ActionStats()
        return stats


@dataclass(slots=True)
class _Tracked:
    key: tuple[str, ActionKind]
    forecast: str
    family: Family
    node: NodeId
    nbytes: int
    bytes_per_block: int
    expected_ms: float
    lease_s: float
    lease_end: float | None = None  # set when it commits
    late: bool = False
    read_after: bool | None = None  # the first route to its node after the lease: found a prefix (None: none yet)


class ActionOutcomes:
    def __init__(self) -> None:
        self._tracked: dict[OrderId, _Tracked] = {}
        # Per family its tracked orders, in issue order: a dict as an ordered set, since OrderId is a
        # str and a set's order follows str hashing, which differs per process (PYTHONHASHSEED); the
        # orders one route closes add their expected ms in this order, and a float sum must not
        # depend on the process.
        self._by_family: dict[Family, dict[OrderId, None]] = defaultdict(dict)
        self._stats: dict[tuple[str, ActionKind], ActionStats] = defaultdict(ActionStats)
        self._policies: set[str] = set()
        # Orders closed unread whose node no request of their family was routed to since, in closing order.
        self._after: dict[OrderId, _Tracked] = {}
        self._after_by_family: dict[Family, dict[OrderId, None]] = defaultdict(dict)  # in closing order

    def issued(self, order: Order, bytes_per_block: int) -> None:
        spec = order.spec
        policy = spec.policy if spec.policy in self._policies or len(self._policies) < MAX_POLICIES else "other"
        self._policies.add(policy)
        key = (policy, spec.action)
        nbytes = len(spec.block_hashes) * bytes_per_block if spec.action.copies else 0
        tracked = _Tracked(key, spec.forecast, spec.family, spec.target, nbytes, bytes_per_block,
                           spec.expected_benefit_ms, spec.lease_ms / 1e3)
        for stats in self._totals(tracked):
            stats.orders += 1
            stats.bytes += nbytes
            stats.expected_ms += spec.expected_benefit_ms
        self._tracked[order.order_id] = tracked
        self._by_family[spec.family][order.order_id] = None

    def transition(self, order: Order, now: float) -> None:
        """The order reached order.state."""
        tracked = self._tracked.get(order.order_id)
        if tracked is None or tracked.lease_end is not None:
            return
        if order.state is OrderState.COMMITTED:
            tracked.lease_end = now + tracked.lease_s
            if not order.spec.action.copies:  # promoted or retained, as reported
                tracked.nbytes = order.blocks_sent * tracked.bytes_per_block
                for stats in self._totals(tracked):
                    stats.bytes += tracked.nbytes
        elif order.state is OrderState.CANCELLED:
            self._close(order.order_id, Outcome.CANCELLED)
        elif order.state in (OrderState.FAILED, OrderState.EXPIRED):
            self._close(order.order_id, Outcome.FAILED)

    def routed(self, family: Family, node: NodeId, cached: bool, now: float) -> None:
        """A request of family went to node (cached: it found a prefix there)."""
        self._routed_after(family, node, cached)
        ids = self._by_family.get(family)
        if not ids:
            return
        for order_id in list(ids):
            tracked = self._tracked[order_id]
            if tracked.lease_end is None:
                tracked.late = True
            elif tracked.node != node:
                continue
            elif now <= tracked.lease_end:
                if cached:
                    self._close(order_id, Outcome.USED_IN_TIME)
            elif tracked.read_after is None:
                tracked.read_after = cached

    def _routed_after(self, family: Family, node: NodeId, cached: bool) -> None:
        ids = self._after_by_family.get(family)
        if not ids:
            return
        for order_id in [i for i in ids if self._after[i].node == node]:
            after = self._forget_after(order_id)
            if cached:
                self._read_after(after)

    def sweep(self, now: float) -> None:
        """Closes the committed actions whose lease is over."""
        over = [i for i, t in self._tracked.items() if t.lease_end is not None and t.lease_end < now]
        for order_id in over:
            self._close(order_id, Outcome.USED_LATE if self._tracked[order_id].late else Outcome.NEVER_USED)
        # Closed in lease-end order, so the oldest come first (within a tick).
        while self._after and _followed_until(next(iter(self._after.values()))) < now:
            self._forget_after(next(iter(self._after)))

    def stats(self) -> dict[tuple[str, ActionKind], ActionStats]:
        return dict(self._stats)

    def _totals(self, tracked: _Tracked) -> tuple[ActionStats, ActionStats]:
        """The totals an order counts in: its (policy, action)'s and, within
        them, its forecast's."""
        stats = self._stats[tracked.key]
        return stats, stats.of_forecast(tracked.forecast)

    def _read_after(self, tracked: _Tracked) -> None:
        for stats in self._totals(tracked):
            stats.read_after_lease += 1
            stats.bytes_read_after_lease += tracked.nbytes

    def _close(self, order_id: OrderId, outcome: Outcome) -> None:
        tracked = self._tracked.pop(order_id)
        ids = self._by_family[tracked.family]
        ids.pop(order_id, None)
        if not ids:
            del self._by_family[tracked.family]
        for stats in self._totals(tracked):
            stats.outcomes[outcome.value] += 1
            stats.bytes_by_outcome[outcome.value] += tracked.nbytes
            stats.expected_ms_by_outcome[outcome.value] += tracked.expected_ms
        if outcome in (Outcome.USED_LATE, Outcome.NEVER_USED):
            self._follow_after(order_id, tracked)

    def _follow_after(self, order_id: OrderId, tracked: _Tracked) -> None:
        if tracked.read_after is not None:  # already routed to after its lease: decided
            if tracked.read_after:
                self._read_after(tracked)
            return
        if len(self._after) >= MAX_AFTERLIFE:
            self._forget_after(next(iter(self._after)))
        self._after[order_id] = tracked
        self._after_by_family[tracked.family][order_id] = None

    def _forget_after(self, order_id: OrderId) -> _Tracked:
        after = self._after.pop(order_id)
        ids = self._after_by_family[after.family]
        ids.pop(order_id, None)
        if not ids:
            del self._after_by_family[after.family]
        return after


def _followed_until(tracked: _Tracked) -> float:
    """Clock s: an order closed unread is followed until AFTERLIFE_S after its lease."""
    assert tracked.lease_end is not None  # closed unread only after it committed
    return tracked.lease_end + AFTERLIFE_S
