"""Policy `reactive-heat`: hot-replica fan-out on observed heat, as
Mooncake's conductor does with its heat window.

Every tick: the families routed at least `reactive_heat.heat_threshold`
times within the last `families.heat_window_s` seconds are hot (hottest
first). A hot family with heat h wants min(`max_replicas`,
1 + h // `heat_per_replica`) live holders; for each one missing (counting
orders still landing as holders) it copies the family's prefix from its best
holder to the least-queued live node holding none of it, while the link and
memory budgets (`budgets.*`) allow, at most `budgets.max_orders_per_tick`
orders a tick, each with a lease of `leases.replica_lease_ms`. It only ever
reacts to routes already seen: the replica lands after the heat was
observed, which is the lag speculation removes. Thresholds: the
`reactive_heat`, `families`, `budgets` and `leases` sections of
services/config/policies.json.
"""
from __future__ import annotations

from speckv.services.scheduler.policies.base import ClusterView
from speckv.services.scheduler.policies.context import PolicyContext
from speckv.services.scheduler.policies.placement import copy_order, holders_of, landing_targets, queue_ms
from speckv.services.scheduler.replication.budgets import BudgetBook
from speckv.services.scheduler.replication.orders import OrderSpec


class ReactiveHeatPolicy:
    name = "reactive-heat"
    description = ("Mooncake-style hot-replica fan-out: families whose routes in the heat window "
                   "cross a threshold are copied to more nodes, one replica per heat step.")

    def __init__(self, context: PolicyContext) -> None:
        self._cfg = context.config
        self._profile = context.profile

    def prepare(self, now: float) -> None:
        return None

    def plan(self, now: float, view: ClusterView) -> list[OrderSpec]:
        if view.families is None:
            return []
        s, limit = self._cfg.reactive_heat, self._cfg.budgets.max_orders_per_tick
        live = {n.node_id: n for n in view.live_nodes()}
        queue = queue_ms(live.values())
        by_load = sorted(live, key=lambda n: (queue[n], n))
        book = BudgetBook(view, self._cfg.budgets)
        orders: list[OrderSpec] = []
        for family, heat in view.families.hot(now, s.heat_threshold):
            profile = view.families.profile(family)
            if profile is None or not profile.chain:
                continue
            holders = holders_of(view, profile, live, self._profile, self._cfg.planner.min_benefit_ms)
            landing = landing_targets(view, family)
            want = min(s.max_replicas, 1 + heat // s.heat_per_replica)
            for _ in range(want - len(set(holders) | landing)):
                if len(orders) >= limit:
                    return orders
                order = copy_order(family, profile.chain, holders, queue, by_load, landing, book, live,
                                   self._cfg.leases.replica_lease_ms, self.name)
                if order is None:
                    break
                landing.add(order.target)
                orders.append(order)
        return orders
