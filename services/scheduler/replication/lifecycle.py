"""Order lifecycle beyond the state machine (orders.py): what happens around
each transition, driven by the kvstores' reports, their KV events and node
liveness.

- COMMITTED (reported by the source's agent, or inferred when the target's
  KV event stream shows every block of the order resident there): a Replica
  enters the ledger with a lease of the order's lease_ms from now. A
  prefetch (or retain) acts on one node's own blocks: it is committed only
  by that node's report, makes no replica and is never retried. A redundant
  copy is a replica in every respect here (ActionKind.copies).
- FAILED: retried from another live node holding the whole chain (not one
  already tried, never the target), up to `max_retries` times; the retry is a
  new order (new id) of the same spec.
- A node going down fails the active orders it is the source of (and they
  are retried elsewhere) or the target of (not retried: the target is gone).
- Transports: each committed copy is counted per (source, target, the data
  plane its source reported) (transports.py).
- cancel(): only orders still ISSUED (not started) can be cancelled.
- Outcomes: every issued order is followed to its outcome (outcomes.py):
  used in time, used late, never used, cancelled or failed.
- Leases: orders without progress for lease_ms expire (OrderTracker.sweep);
  replica leases end in the ledger (LeasedReplicas.expire).

Not thread-safe: SchedulerCore serialises access. Times are clock seconds.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable

from speckv.services.common.errors import FailedPrecondition, SpeckvError
from speckv.services.common.ids import NodeId, OrderId
from speckv.services.scheduler.orders import Order, OrderSpec, OrderState, OrderTracker
from speckv.services.scheduler.replication.outcomes import ActionOutcomes
from speckv.services.scheduler.replication.replicas import LeasedReplicas, Replica
from speckv.services.scheduler.replication.transports import TransportTally, check_transport
from speckv.services.scheduler.views import IndexReader

log = logging.getLogger(__name__)

SubmitFn = Callable[[OrderSpec, float], Order]  # validates nodes, issues and publishes
AliveFn = Callable[[NodeId, float], bool]
BytesPerBlockFn = Callable[[NodeId], int]


@dataclass(slots=True)
class _Attempts:
    retries: int
    tried: frozenset[NodeId]


class OrderLifecycle:
    def __init__(self, orders: OrderTracker, ledger: LeasedReplicas, index: IndexReader, submit: SubmitFn,
                 alive: AliveFn, bytes_per_block: BytesPerBlockFn, max_retries: int) -> None:
        self.orders = orders
        self.ledger = ledger
        self._index = index
        self._submit = submit
        self._alive = alive
        self._bytes_per_block = bytes_per_block
        self._max_retries = max_retries
        self._attempts: dict[OrderId, _Attempts] = {}
        self.retries_issued = 0
        self.outcomes = ActionOutcomes()
        self.transports = TransportTally()  # committed copies per (source, target, transport)

    def report(self, order_id: str, state: OrderState, now: float, message: str = "",
               bytes_sent: int = 0, blocks_sent: int = 0, transport: str = "") -> Order:
        current = self.orders.get(order_id)
        before, labelled = current.state, current.transport
        try:
            order = self.orders.report(order_id, state, now, message, bytes_sent, blocks_sent,
                                       check_transport(transport))
        except FailedPrecondition:
            current = self.orders.get(order_id)
            if current.state.terminal:  # it expired on the way in
                self._attempts.pop(OrderId(order_id), None)
                self.outcomes.transition(current, now)
            raise
        if order.state is not before:
            self._after(order, now)
        elif order.state is OrderState.COMMITTED and order.spec.action.copies and order.transport != labelled:
            self.transports.relabel(order.spec.source, order.spec.target, order.transport, self._copy_bytes(order))
        return order

    def cancel(self, order_id: str, now: float, reason: str) -> Order:
        order = self.orders.get(order_id)
        if order.state is not OrderState.ISSUED:
            raise FailedPrecondition(f"order {order_id!r} is {order.state.name}; only ISSUED orders can be cancelled")
        return self.report(order_id, OrderState.CANCELLED, now, reason)

    def kv_committed(self, node: NodeId, now: float) -> list[Order]:
        """Commits active orders to node whose blocks the index now shows there."""
        done = []
        for order in [o for o in self.orders.active()
                      if o.spec.target == node and o.spec.action.copies]:
            blocks = order.spec.block_hashes
            if self._index.longest_prefix(node, blocks) == len(blocks):
                done.append(self.report(order.order_id, OrderState.COMMITTED, now, "seen in the target's KV events"))
        return done

    def node_down(self, node: NodeId, now: float) -> None:
        for order in [o for o in self.orders.active() if node in (o.spec.source, o.spec.target)]:
            role = "source" if order.spec.source == node else "target"
            self.report(order.order_id, OrderState.FAILED, now, f"{role} node {node} is down")

    def sweep(self, now: float) -> tuple[list[Order], list[Replica]]:
        """Expires stale orders and ends replica leases; returns both."""
        expired = self.orders.sweep(now)
        for order in expired:
            self._attempts.pop(order.order_id, None)
            self.outcomes.transition(order, now)
        self.outcomes.sweep(now)
        return expired, self.ledger.expire(now)

    def issued(self, order: Order) -> None:
        """Registers a freshly submitted order (first attempt)."""
        self._attempts[order.order_id] = _Attempts(0, frozenset({order.spec.source}))
        self.outcomes.issued(order, self._bytes_per_block(order.spec.target))

    def _after(self, order: Order, now: float) -> None:
        if not order.state.terminal:
            return
        self.outcomes.transition(order, now)
        attempts = self._attempts.pop(order.order_id, _Attempts(0, frozenset({order.spec.source})))
        if not order.spec.action.copies:
            return  # a prefetch or retain on one node: no replica to lease, no other source to retry from
        if order.state is OrderState.COMMITTED:
            blocks, nbytes = len(order.spec.block_hashes), self._copy_bytes(order)
            self.ledger.add(Replica(order.order_id, order.spec.family, order.spec.target, blocks, nbytes,
                                    now, now + order.spec.lease_ms / 1000.0))
            # Last: its journal write may raise (Unavailable) after the commit is recorded.
            self.transports.add(order.spec.source, order.spec.target, order.transport, nbytes)
        elif order.state is OrderState.FAILED:
            self._retry(order, attempts, now)

    def _copy_bytes(self, order: Order) -> int:
        """The bytes a committed copy moved: as reported, else its blocks'."""
        return order.bytes_sent or len(order.spec.block_hashes) * self._bytes_per_block(order.spec.target)

    def _retry(self, order: Order, attempts: _Attempts, now: float) -> None:
        spec = order.spec
        if attempts.retries >= self._max_retries or not self._alive(spec.target, now):
            return
        chain = spec.block_hashes
        sources = sorted(n for n, k in self._index.prefix_lengths(chain, len(chain)).items()
                         if k == len(chain) and n not in attempts.tried and n != spec.target and self._alive(n, now))
        if not sources:
            return
        try:
            retry = self._submit(replace(spec, source=sources[0], order_id="", block_hashes=list(chain),
                                         expected_benefit_ms=0.0), now)
        except SpeckvError as exc:
            log.info("order %s: retry from %s not possible: %s", order.order_id, sources[0], exc)
            return
        self._attempts[retry.order_id] = _Attempts(attempts.retries + 1, attempts.tried | {sources[0]})
        self.retries_issued += 1
        log.info("order %s failed (%s); retrying from %s as %s", order.order_id, order.message, sources[0],
                 retry.order_id)
