"""Policy `reactive-heat`: hot-replica fan-out on observed heat, as
Mooncake Store's dynamic hot replication does (kvcache-ai/Mooncake PR #3389).

Every tick: the families routed at least `reactive_heat.heat_threshold`
times within the last `families.heat_window_s` seconds are hot (hottest
first; the committed 8 routes in 10 s is Mooncake's 0.8 reads per second). A
hot family with heat h wants min(`max_replicas`, 1 + h // `heat_per_replica`)
live holders (Mooncake: at most 2 memory replicas); for each one missing
(counting orders still landing as holders) it copies the family's prefix
from its best holder to the least-queued live node holding none of it, while
the link and memory budgets (`budgets.*`) allow, at most
`budgets.max_orders_per_tick` orders a tick, each with a lease of
`leases.replica_lease_ms`, into the target's default tier (its host tier
when it has one, like Mooncake's memory replicas).

Two brakes, as Mooncake's admission has them: after an order for a family,
no new one for it for `action_cooldown_s`; once a replica this policy
placed is gone from its target (evicted, or its node down), none is
re-created for that family for `recreate_after_s`. It only ever reacts to
routes already seen: the replica lands after the heat was observed, which is
the lag speculation removes. Thresholds: the `reactive_heat`, `families`,
`budgets` and `leases` sections of services/config/policies.json.
"""
from __future__ import annotations

from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.policies.context import PolicyContext
from speckv.services.scheduler.policies.placement import copy_order, landing_targets, queue_ms
from speckv.services.scheduler.replication.budgets import BudgetBook
from speckv.services.scheduler.orders import OrderSpec
from speckv.services.scheduler.views import ClusterView, NodeView, holders_of


class ReactiveHeatPolicy:
    name = "reactive-heat"
    description = ("Mooncake-style hot-replica fan-out: families whose routes in the heat window "
                   "cross a threshold are copied to more nodes, one replica per heat step, with "
                   "an action cooldown and a pause before re-creating an evicted replica.")

    def __init__(self, context: PolicyContext) -> None:
        self._cfg = context.config
        self._profile = context.profile
        self._last_action: dict[Family, float] = {}  # family -> when this policy last ordered a copy of it
        # family -> target -> last block of the copy sent there, until seen gone
        self._placed: dict[Family, dict[NodeId, int]] = {}
        self._paused_until: dict[Family, float] = {}  # family -> no re-creation before this time

    def prepare(self, now: float) -> None:
        return None

    def plan(self, now: float, view: ClusterView) -> list[OrderSpec]:
        if view.families is None:
            return []
        s, limit = self._cfg.reactive_heat, self._cfg.budgets.max_orders_per_tick
        live = {n.node_id: n for n in view.live_nodes()}
        self._notice_gone(now, view, live)
        queue = queue_ms(live.values())
        by_load = sorted(live, key=lambda n: (queue[n], n))
        book = BudgetBook(view, self._cfg.budgets)
        orders: list[OrderSpec] = []
        for family, heat in view.families.hot(now, s.heat_threshold):
            if self._braked(family, now):
                continue
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
                self._last_action[family] = now
                self._placed.setdefault(family, {})[order.target] = order.block_hashes[-1]
        return orders

    def _braked(self, family: Family, now: float) -> bool:
        s = self._cfg.reactive_heat
        last = self._last_action.get(family)
        if last is not None and now - last < s.action_cooldown_s:
            return True
        return now < self._paused_until.get(family, float("-inf"))

    def _notice_gone(self, now: float, view: ClusterView, live: dict[NodeId, NodeView]) -> None:
        """A target that no longer holds the last block of the copy it got
        (and has no copy of the family landing) lost the replica: pause the
        family's re-creation. Forgets what no brake needs any more, so the
        state stays bounded by the families acted on in the last cooldown
        and pause."""
        s = self._cfg.reactive_heat
        for family in list(self._placed):
            landing = landing_targets(view, family)
            targets = self._placed[family]
            gone = [t for t, last in targets.items()
                    if t not in landing and (t not in live or t not in view.index.holders(last))]
            if gone:
                self._paused_until[family] = now + s.recreate_after_s
                for t in gone:
                    del targets[t]
            if not targets:
                del self._placed[family]
        horizon = max(s.action_cooldown_s, 0.0)
        for family in [f for f, t in self._last_action.items() if now - t >= horizon and f not in self._placed]:
            del self._last_action[family]
        for family in [f for f, t in self._paused_until.items() if t <= now]:
            del self._paused_until[family]
