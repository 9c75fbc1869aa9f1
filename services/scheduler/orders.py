"""Replication orders: validation, ids and the lifecycle.

    ISSUED -> IN_FLIGHT -> COMMITTED | FAILED | CANCELLED | EXPIRED
    ISSUED -> COMMITTED | FAILED | CANCELLED | EXPIRED   (progress may be unreported)
    IN_FLIGHT -> IN_FLIGHT                               (progress: refreshes the lease)

Terminal states never change; repeating the same terminal report is an
idempotent no-op (a retried ack), any other transition is FailedPrecondition.

Lease: an active order whose last progress (submission or an IN_FLIGHT
report) is more than lease_ms old is EXPIRED by `sweep()` or at the next
report. lease_ms is also the replica's lease on the target, so an order that
cannot land within it would be pointless anyway.

Counts: ISSUED and IN_FLIGHT count orders active now; terminal states count
every order that ever reached them. Only the newest `max_retained` terminal
orders are kept for reports (older ones answer NotFound).

Journal: when the tracker has one (the scheduler's durable state,
services/scheduler/adapters/state_store.py), every change of the log is written to it
as it happens: a submission before the order is issued (a failed write
issues nothing), every transition after it is made, with the ids the
retention just dropped. `restore()` loads a saved log into an empty tracker.

Not thread-safe: SchedulerCore serialises access. Times are clock seconds.
"""
from __future__ import annotations

import dataclasses
import enum
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from speckv.services.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from speckv.services.common.ids import UINT64_MAX, Family, NodeId, OrderId
from speckv.services.common.tiers import Tier


class ActionKind(enum.Enum):
    """What an order does. REPLICATE copies a prefix from source to target;
    REDUNDANT does the same, priced as a second copy of a prefix with one
    holder against that holder failing (replication/redundancy.py), and is
    executed exactly like REPLICATE; PREFETCH promotes the blocks of a
    prefix that a holder keeps only in its host tier into its device tier;
    RETAIN keeps the prefix a holder has from leaving it until the order's
    lease ends (services/common/retention.py); STAGE reads the blocks of a
    prefix that a holder keeps only on its disk tier into its host tier
    (issue 44: ahead of a forecast return, so the return's promotion crosses
    the host link only). REPLICATE and REDUNDANT copy to a peer (source !=
    target); PREFETCH, RETAIN and STAGE act on one node (source == target).

    STAGE is an action of its own rather than a PREFETCH naming the host
    tier: it lands somewhere else (the host tier, so it displaces host
    blocks down to the disk rather than device blocks down to the host),
    it is priced on another term (the disk read it takes off the return's
    critical path, not the host copy), the outcome table and the
    simulator's ablation (`predictive-without-stage`) measure it apart, and
    a kvstore that predates it refuses the unknown action by name instead
    of promoting into its device tier as it would a prefetch."""

    REPLICATE = "replicate"
    REDUNDANT = "redundant"
    PREFETCH = "prefetch"
    RETAIN = "retain"
    STAGE = "stage"

    @property
    def copies(self) -> bool:
        """The order copies its prefix from source to target over the
        network: it moves bytes, spends the link and memory budgets and
        leaves a leased replica on the target."""
        return self is ActionKind.REPLICATE or self is ActionKind.REDUNDANT

    @staticmethod
    def parse(text: str) -> "ActionKind":
        """The wire form: "replicate" (or empty), "redundant", "prefetch", "retain" or "stage"."""
        try:
            return ActionKind(text or "replicate")
        except ValueError:
            raise InvalidArgument(f"order action {text!r}: expected replicate, redundant, prefetch, retain "
                                  "or stage") from None


class OrderState(enum.Enum):
    ISSUED = "issued"
    IN_FLIGHT = "in_flight"
    COMMITTED = "committed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self not in (OrderState.ISSUED, OrderState.IN_FLIGHT)


ALLOWED: dict[OrderState, frozenset[OrderState]] = {
    OrderState.ISSUED: frozenset({OrderState.IN_FLIGHT, OrderState.COMMITTED, OrderState.FAILED,
                                  OrderState.CANCELLED, OrderState.EXPIRED}),
    OrderState.IN_FLIGHT: frozenset({OrderState.IN_FLIGHT, OrderState.COMMITTED, OrderState.FAILED,
                                     OrderState.CANCELLED, OrderState.EXPIRED}),
}


@dataclass(slots=True)
class OrderSpec:
    """What a policy or an operator asks for; the tracker turns it into an Order."""

    family: Family
    block_hashes: list[int]
    source: NodeId
    target: NodeId
    lease_ms: int
    priority: int = 0
    expected_benefit_ms: float = 0.0
    policy: str = ""
    target_address: str = ""
    order_id: str = ""
    tier: Tier | None = None  # where the target keeps the copy; None: its host tier when it has one
    action: ActionKind = ActionKind.REPLICATE
    # Which forecast the planner bought it for ("burst", "return", "retention":
    # forecasts.ForecastKind's values); "" when none did (an operator's order, a
    # reactive policy's, one restored from the journal, which does not keep it).
    forecast: str = ""


@dataclass(slots=True)
class Order:
    order_id: OrderId
    spec: OrderSpec
    state: OrderState
    created_at: float
    last_progress: float
    message: str = ""
    bytes_sent: int = 0
    blocks_sent: int = 0
    transport: str = ""  # the data plane its source reported it went over ("" until reported; not journaled)

    def lease_end(self) -> float:
        return self.last_progress + self.spec.lease_ms / 1000.0

    def snapshot(self) -> "Order":
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, block_hashes=list(self.spec.block_hashes)))


def validate_spec(spec: OrderSpec) -> None:
    if not spec.source:
        raise InvalidArgument("order.source_node is empty")
    if not spec.target:
        raise InvalidArgument("order.target_node is empty")
    if spec.action.copies and spec.source == spec.target:
        raise InvalidArgument(f"order.source_node == order.target_node ({spec.source!r}): a replica needs a peer")
    if not spec.action.copies and spec.source != spec.target:
        raise InvalidArgument(f"a {spec.action.value} order acts on one node: source_node {spec.source!r} "
                              f"!= target_node {spec.target!r}")
    if not spec.block_hashes:
        raise InvalidArgument("order.block_hashes is empty")
    if len(set(spec.block_hashes)) != len(spec.block_hashes):
        raise InvalidArgument("order.block_hashes repeats a hash; a chain never does")
    if any(not 0 <= h <= UINT64_MAX for h in spec.block_hashes):
        raise InvalidArgument("order.block_hashes: hashes are uint64")
    if spec.lease_ms <= 0:
        raise InvalidArgument(f"order.lease_ms={spec.lease_ms}: must be > 0")


class OrderJournal(Protocol):
    """Where an OrderTracker records each change of its log as it happens."""

    def order_issued(self, order: Order, next_id: int) -> None:
        """order is about to be issued (ISSUED); next_id is the number the
        tracker's next generated id will carry. Raising issues nothing."""
        ...

    def order_changed(self, order: Order, evicted: Sequence[OrderId]) -> None:
        """order moved to order.state (or made IN_FLIGHT progress); a
        terminal state comes once per order. evicted: terminal orders the
        retention forgot on the way, oldest first."""
        ...


@dataclass(slots=True)
class OrderTracker:
    max_retained: int = 10_000
    journal: OrderJournal | None = None  # None: the log lives in memory only
    _active: dict[OrderId, Order] = field(default_factory=dict)
    _done: OrderedDict[OrderId, Order] = field(default_factory=OrderedDict)
    _totals: dict[OrderState, int] = field(default_factory=lambda: {s: 0 for s in OrderState})
    _next_id: int = 1

    def submit(self, spec: OrderSpec, now: float) -> Order:
        """Validates spec (node checks are the caller's) and issues it."""
        validate_spec(spec)
        order_id = OrderId(spec.order_id) if spec.order_id else self._new_id()
        if order_id in self._active or order_id in self._done:
            raise AlreadyExists(f"order {order_id!r} exists")
        order = Order(order_id, spec, OrderState.ISSUED, created_at=now, last_progress=now)
        order.spec.order_id = order_id
        if self.journal is not None:
            self.journal.order_issued(order, self._next_id)
        self._active[order_id] = order
        return order

    def restore(self, orders: Sequence[Order], next_id: int, totals: Mapping[OrderState, int],
                now: float) -> list[Order]:
        """Loads a saved log into this empty tracker (a restart) and returns
        the active orders. Active ones (ISSUED, IN_FLIGHT) come back as they
        were, their last progress now, so their leases run from the restart;
        terminal ones in the order given (the order they finished), the
        newest max_retained kept; generated ids continue at next_id (never
        below where this tracker stands); totals: the terminal states' counts.
        Nothing is written to the journal (it already holds all of it)."""
        if self._active or self._done:
            raise FailedPrecondition("orders can only be restored into an empty tracker")
        for order in orders:
            if order.state.terminal:
                self._done[order.order_id] = order
            else:
                order.last_progress = now
                self._active[order.order_id] = order
        while len(self._done) > self.max_retained:
            self._done.popitem(last=False)
        for state, count in totals.items():
            if state.terminal:
                self._totals[state] = count
        self._next_id = max(self._next_id, next_id)
        return list(self._active.values())

    def clear(self) -> None:
        """Forgets every order, active and terminal, without a word to the journal: a scheduler replica that
        stops leading hands them to the next leader through the shared state. Generated ids keep their
        place (a later restore never goes below it)."""
        self._active.clear()
        self._done.clear()
        self._totals = {s: 0 for s in OrderState}

    def report(self, order_id: str, state: OrderState, now: float, message: str = "",
               bytes_sent: int = 0, blocks_sent: int = 0, transport: str = "") -> Order:
        """Moves an order to state; returns it. transport: the data plane the
        source says carried it ("" keeps what was reported before)."""
        order = self.get(order_id)
        self._expire_if_due(order, now)
        if order.state.terminal and state is order.state:
            order.transport = order.transport or transport  # a late report labels a commit already seen
            return order
        if state not in ALLOWED.get(order.state, frozenset()):
            raise FailedPrecondition(
                f"order {order_id!r} is {order.state.name}; cannot move to {state.name}")
        order.message = message or order.message
        order.bytes_sent = max(order.bytes_sent, bytes_sent)
        order.blocks_sent = max(order.blocks_sent, blocks_sent)
        order.transport = transport or order.transport
        if state is OrderState.IN_FLIGHT:
            order.last_progress = now
        self._move(order, state)
        return order

    def sweep(self, now: float) -> list[Order]:
        """Expires active orders whose lease passed without progress."""
        due = [o for o in self._active.values() if now > o.lease_end()]
        for order in due:
            order.message = "lease passed without progress"
            self._move(order, OrderState.EXPIRED)
        return due

    def get(self, order_id: str) -> Order:
        if not order_id:
            raise InvalidArgument("order_id is empty")
        order = self._active.get(OrderId(order_id)) or self._done.get(OrderId(order_id))
        if order is None:
            raise NotFound(f"order {order_id!r} is unknown")
        return order

    def active(self, source: NodeId | None = None) -> list[Order]:
        return [o for o in self._active.values() if source is None or o.spec.source == source]

    def counts(self) -> dict[OrderState, int]:
        counts = dict(self._totals)
        for state in (OrderState.ISSUED, OrderState.IN_FLIGHT):
            counts[state] = sum(1 for o in self._active.values() if o.state is state)
        return counts

    def _expire_if_due(self, order: Order, now: float) -> None:
        if not order.state.terminal and now > order.lease_end():
            order.message = "lease passed without progress"
            self._move(order, OrderState.EXPIRED)

    def _move(self, order: Order, state: OrderState) -> None:
        order.state = state
        evicted: list[OrderId] = []
        if state.terminal:
            self._totals[state] += 1
            self._active.pop(order.order_id, None)
            self._done[order.order_id] = order
            while len(self._done) > self.max_retained:
                evicted.append(self._done.popitem(last=False)[0])
        if self.journal is not None:
            self.journal.order_changed(order, evicted)

    def _new_id(self) -> OrderId:
        while True:
            order_id = OrderId(f"o-{self._next_id:08d}")
            self._next_id += 1
            if order_id not in self._active and order_id not in self._done:
                return order_id
