"""Policy `reactive-migrate`: move a hot family's KV off an overloaded node,
as Llumnix rebalances load once a queue has formed.

Every tick, for each live node whose expected queueing delay exceeds
`reactive_migrate.queue_threshold_ms` (most queued first): take the family
routed to it most within the heat window (`families.heat_window_s`), if that
is at least `min_family_heat` routes and the family was not moved within the
last `cooldown_s` seconds; copy its prefix (from its best holder, usually
that node) to the least-queued live node whose queue is under
`target_queue_below_ms` and which holds none of it, within the link and
memory budgets (`budgets.*`), with a lease of `leases.replica_lease_ms`. The
router then sends the family's next requests to the idle copy because its
expected TTFT is lower; the kvstores offer no delete, so the source's copy
stays as ordinary cache. One family per overloaded node per tick, at most
`budgets.max_orders_per_tick` orders. Thresholds: the `reactive_migrate`,
`families`, `budgets` and `leases` sections of services/config/policies.json.
"""
from __future__ import annotations

from speckv.services.common.ids import Family
from speckv.services.scheduler.policies.context import PolicyContext
from speckv.services.scheduler.policies.placement import copy_order, landing_targets, queue_ms
from speckv.services.scheduler.replication.budgets import BudgetBook
from speckv.services.scheduler.orders import OrderSpec
from speckv.services.scheduler.views import ClusterView, holders_of


class ReactiveMigratePolicy:
    name = "reactive-migrate"
    description = ("Llumnix-style rebalancing: once a node's queue exceeds a threshold, its hottest "
                   "family's KV is copied to an idle node so new requests go there.")

    def __init__(self, context: PolicyContext) -> None:
        self._cfg = context.config
        self._profile = context.profile
        self._moved_at: dict[Family, float] = {}

    def prepare(self, now: float) -> None:
        return None

    def plan(self, now: float, view: ClusterView) -> list[OrderSpec]:
        if view.families is None:
            return []
        s = self._cfg.reactive_migrate
        live = {n.node_id: n for n in view.live_nodes()}
        queue = queue_ms(live.values())
        overloaded = sorted((n for n in live if queue[n] > s.queue_threshold_ms), key=lambda n: (-queue[n], n))
        if not overloaded:
            return []
        idle = [n for n in sorted(live, key=lambda n: (queue[n], n)) if queue[n] < s.target_queue_below_ms]
        hottest = view.families.hottest_by_node(now)
        book = BudgetBook(view, self._cfg.budgets)
        orders: list[OrderSpec] = []
        for node in overloaded:
            family, heat = hottest.get(node, (None, 0))
            if family is None or heat < s.min_family_heat or now - self._moved_at.get(family, -1e18) < s.cooldown_s:
                continue
            profile = view.families.profile(family)
            if profile is None or not profile.chain:
                continue
            holders = holders_of(view, profile, live, self._profile, self._cfg.planner.min_benefit_ms)
            order = copy_order(family, profile.chain, holders, queue, idle, landing_targets(view, family), book,
                               live, self._cfg.leases.replica_lease_ms, self.name)
            if order is not None:
                self._moved_at[family] = now
                orders.append(order)
                if len(orders) >= self._cfg.budgets.max_orders_per_tick:
                    break
        return orders
