"""The scheduler core's order desk: submitting, reporting, cancelling and
watching orders (SubmitOrder, ReportOrder, CancelOrder, GetOrder,
WatchOrders), a mixin of SchedulerCore (core.py), which owns every attribute
it reads. Every method takes the core's lock (or runs under it: the _locked
ones), as the rest of the facade does.

What an order must satisfy against its nodes is admission.py; its transitions
(retries, replicas, commits seen in KV events) are OrderLifecycle's
(lifecycle.py). An issued copy is booked on its source's link when issued
(routing/link_backlog.py), a stage's read on its target's disk
(routing/disk_backlog.py), so routes see the transfers already started.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from speckv.services.common.clock import Clock
from speckv.services.common.errors import FailedPrecondition
from speckv.services.common.ids import NodeId
from speckv.services.scheduler.cluster import Cluster
from speckv.services.scheduler.holder_index import HolderIndex
from speckv.services.scheduler.orders import ActionKind, Order, OrderSpec, OrderState, OrderTracker, validate_spec
from speckv.services.scheduler.replication.admission import admitted
from speckv.services.scheduler.replication.lifecycle import OrderLifecycle
from speckv.services.scheduler.replication.order_feed import OrderFeed, Watcher

if TYPE_CHECKING:  # annotations only: routing imports replication, not the other way
    from speckv.services.scheduler.routing.disk_backlog import DiskBacklog
    from speckv.services.scheduler.routing.link_backlog import LinkBacklog


class OrderDesk:
    """The order RPCs of SchedulerCore; the attributes below are the core's."""

    _lock: threading.Lock
    _clock: Clock
    _cluster: Cluster
    _index: HolderIndex
    _orders: OrderTracker
    _lifecycle: OrderLifecycle
    _feed: OrderFeed
    _backlog: LinkBacklog
    _disks: DiskBacklog

    def submit_order(self, spec: OrderSpec) -> Order:
        with self._lock:
            return self._submit_locked(spec, self._clock.now())

    def report_order(self, order_id: str, state: OrderState, message: str = "",
                     bytes_sent: int = 0, blocks_sent: int = 0, transport: str = "") -> OrderState:
        with self._lock:
            order = self._lifecycle.report(order_id, state, self._clock.now(), message, bytes_sent, blocks_sent,
                                           transport)
            if order.state is OrderState.CANCELLED:
                self._feed.publish(order.snapshot())  # its source may hold the issued copy
            return order.state

    def cancel_order(self, order_id: str, reason: str = "cancelled") -> Order:
        """Cancels an order not yet started (ISSUED); FailedPrecondition otherwise."""
        with self._lock:
            return self._cancel_locked(order_id, self._clock.now(), reason)

    def get_order(self, order_id: str) -> Order:
        with self._lock:
            return self._orders.get(order_id).snapshot()

    def _cancel_locked(self, order_id: str, now: float, reason: str) -> Order:
        """Cancels an ISSUED order and tells its source's watchers, which
        may already hold the issued copy: they get one with `cancelled` set."""
        order = self._lifecycle.cancel(order_id, now, reason).snapshot()
        self._feed.publish(order)
        return order

    def watch_orders(self, node_id: str) -> Watcher:
        """A watcher of orders whose source is node_id ("" = all), primed with
        the ones still ISSUED so a reconnecting node misses nothing."""
        with self._lock:
            source = self._cluster.get(NodeId(node_id)).node_id if node_id else None
            backlog = [o.snapshot() for o in self._orders.active(source) if o.state is OrderState.ISSUED]
            return self._feed.watch(source, backlog)

    def unwatch(self, watcher: Watcher) -> None:
        self._feed.unwatch(watcher)

    def _submit_locked(self, spec: OrderSpec, now: float) -> Order:
        validate_spec(spec)
        source, target = self._cluster.get(spec.source), self._cluster.get(spec.target)
        for node in (source, target):
            if not self._cluster.is_alive(node, now):
                raise FailedPrecondition(f"node {node.node_id!r} is down; it takes no orders")
        spec = admitted(spec, target)
        order = self._orders.submit(spec, now)
        self._lifecycle.issued(order)
        if spec.action.copies:
            # Booked when issued; a cancelled order's booking lapses on its own.
            self._backlog.add(spec.source, spec.target, len(spec.block_hashes) * source.bytes_per_block, now)
        elif spec.action is ActionKind.STAGE:  # its read holds the target's disk (disk_backlog.py)
            chain = spec.block_hashes
            self._disks.add_stage(target.node_id, chain, self._index.disk_only_count(target.node_id, chain, len(chain)),
                                  target.bytes_per_block, now)
        self._feed.publish(order.snapshot())
        return order.snapshot()

    def _alive(self, node_id: NodeId, now: float) -> bool:
        node = self._cluster.find(node_id)
        return node is not None and self._cluster.is_alive(node, now)

    def _bytes_per_block(self, node_id: NodeId) -> int:
        node = self._cluster.find(node_id)
        return node.geometry.bytes_per_block if node else 0
