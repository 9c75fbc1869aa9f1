"""Resuming a scheduler core from what a previous run saved (ports.SavedState):
once, on a core with no nodes and no orders, before serving.

- Policy: the one SetPolicy last chose, unless it cannot run with this run's
  settings (e.g. oracle without a trace): then the configured one stays,
  with a warning.
- Nodes: each is known (heartbeats answer known=True, orders may name it)
  but not alive until its next heartbeat: no routes, no orders to or from it
  before then. The core's listener hears of it as a new registration, so its
  block index is rebuilt from its KV event stream from sequence 0.
- Orders: ISSUED and IN_FLIGHT ones come back as they were, their leases
  running from now, so their agents' reports still find them and WatchOrders
  sends the ISSUED ones again; terminal ones stay reportable up to the
  tracker's retention; generated ids continue at saved.next_order_id, so none
  is ever reused.
- Committed copies by transport (the tally `speckv status` prints): as saved,
  replacing the core's (a replica taking over drops the figures it held).
Not restored: replica leases, outcome statistics and link bookings of the
orders before the restart (they start empty, as in a new run). Nothing is
written back.

adopt_state is the same for a scheduler replica that has just been elected,
on a live core (docs/replicas.md).
"""
from __future__ import annotations

import logging
import math

from speckv.services.common.errors import FailedPrecondition, SpeckvError
from speckv.services.common.ids import NodeId
from speckv.services.scheduler.cluster import Cluster, NodeStatus
from speckv.services.scheduler.orders import OrderTracker
from speckv.services.scheduler.policies.base import Policy
from speckv.services.scheduler.policies.registry import PolicyRegistry
from speckv.services.scheduler.ports import SavedState
from speckv.services.scheduler.replication.lifecycle import OrderLifecycle

log = logging.getLogger(__name__)


def saved_policy(saved: SavedState, current: Policy, registry: PolicyRegistry) -> Policy | None:
    """The saved policy, built (outside the core's lock: building may read
    files); None when it is the current one, absent, or cannot run here."""
    if not saved.policy or saved.policy == current.name:
        return None
    try:
        return registry.create(saved.policy)
    except SpeckvError as exc:
        log.warning("the saved policy %s cannot run here (%s); keeping %s", saved.policy, exc, current.name)
        return None


def restore_nodes_and_orders(saved: SavedState, cluster: Cluster, orders: OrderTracker, lifecycle: OrderLifecycle,
                             now: float) -> list[tuple[NodeId, str, int]]:
    """Loads saved's nodes and orders (under the core's lock); returns each
    node's (id, address, generation) for the listener. FailedPrecondition
    when the core already has nodes or orders."""
    if cluster.num_nodes() or any(orders.counts().values()):
        raise FailedPrecondition("restore needs a scheduler with no nodes and no orders")
    registered: list[tuple[NodeId, str, int]] = []
    for n in saved.nodes:
        # Registered as last heard at -inf: not alive (for the cluster and its load
        # board alike) until a heartbeat, and RESTORED, not UP, so staying silent is no
        # UP -> DOWN transition that would fail the orders it is part of.
        node, _ = cluster.register(n.node_id, n.address, n.sizes, n.geometry, -math.inf)
        node.status = NodeStatus.RESTORED
        registered.append((node.node_id, node.address, node.generation))
    for order in orders.restore(saved.orders, saved.next_order_id, saved.order_totals, now):
        lifecycle.issued(order)
    lifecycle.transports.restore(saved.transports)
    return registered


def adopt_state(saved: SavedState, cluster: Cluster, orders: OrderTracker, lifecycle: OrderLifecycle,
                now: float) -> list[tuple[NodeId, str, int]]:
    """A replica that now leads takes the shared state over (under the
    core's lock): the saved orders replace whatever its tracker held (a
    replica that does not lead holds none; one deposed and elected again
    holds what it had, older than the shared log), generated ids continue at
    saved.next_order_id, and the ISSUED ones reach WatchOrders again (the
    kvstores' fences drop those they already ran). Saved nodes this replica
    has not heard from come in as after a restart (known, not alive until a
    heartbeat); returns those for the listener. Live nodes stay as they are."""
    registered: list[tuple[NodeId, str, int]] = []
    for n in saved.nodes:
        if cluster.find(n.node_id) is None:
            node, _ = cluster.register(n.node_id, n.address, n.sizes, n.geometry, -math.inf)
            node.status = NodeStatus.RESTORED
            registered.append((node.node_id, node.address, node.generation))
    orders.clear()
    for order in orders.restore(saved.orders, saved.next_order_id, saved.order_totals, now):
        lifecycle.issued(order)
    lifecycle.transports.restore(saved.transports)
    return registered
