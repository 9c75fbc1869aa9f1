"""The replication planner: forecasts + cluster state -> replication orders.

Each tick, for the families forecast to bring at least
`min_expected_requests` requests within the next `horizon_s` seconds (demand
d_f = the forecast's upper quantile or expected count, per `demand`; at most
`max_families_per_tick`, largest first):

1. Supply. A node n holding the family's prefix (L_n blocks, from the block
   index) serves one request in c_n = prefill_ms(P - L_n*S, L_n*S) (P the
   family's mean prompt, S the block size). Only nodes whose L_n saves at
   least `min_benefit_ms` per request count as holders: one that holds just
   what every family shares (a system prompt) is a candidate like any other. Within the horizon plus the TTFT
   target T it can take cap_n = (1000*H + T - queue_n) / c_n requests before
   their TTFT breaks T, and none when queue_n + c_n > T (a request may come
   at once, before the queue drains); queue_n includes work this tick
   already assigned it for hotter families. Holders (then targets of orders still landing) absorb
   demand in order of least queue; what is left is the excess E_f.
2. Candidates. For each family with E_f > 0, the `candidates_per_family`
   least-queued live nodes holding none of it. A replica there (copying the
   longest held prefix, L* blocks, from the least-queued holder of it) could
   take cap_t = (1000*H + T - queue_t - transfer_ms) / c_t requests.
3. Benefit and cost. benefit = min(E_f, cap_t) * (prefill_ms(P, 0) - c_t):
   requests it absorbs times the prefill time each saves; cost from the
   BudgetBook (bytes over the source's and the target's link budgets plus the
   share of the target's pages it would evict). Replicas saving under
   `min_benefit_ms` are dropped.
4. Greedy selection by benefit/cost under the budgets (lazy: a popped
   candidate is re-priced against the family's remaining excess and the
   target's remaining capacity, and pushed back if it got worse), at most
   `max_orders_per_tick` orders, one per (family, target).
5. Cancellation. Orders of this policy still ISSUED whose family is no longer
   forecast above `min_expected_requests` are cancelled (not yet started, so
   nothing is lost).

Every order carries `replica_lease_ms`. Pure: no I/O, time only from `now`.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from speckv.services.common.engine_profile import EngineProfile, LinkModel
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.forecasts import Forecast
from speckv.services.scheduler.policies.base import ClusterView, NodeView, Plan
from speckv.services.scheduler.policies.placement import holders_of
from speckv.services.scheduler.policy_config import PolicyConfig
from speckv.services.scheduler.replication.budgets import BudgetBook
from speckv.services.scheduler.replication.orders import OrderSpec, OrderState


@dataclass(slots=True)
class _Family:
    family: Family
    demand: float
    chain: list[int]
    prompt_tokens: int
    source: NodeId
    held_blocks: int  # L*: the longest prefix held, copied by a replica
    excess: float
    full_ms: float  # prefill without any cache
    hit_ms: float  # prefill with L* blocks cached
    nodes: frozenset[NodeId]  # holders and targets of orders still landing


class Planner:
    def __init__(self, config: PolicyConfig, profile: EngineProfile, link: LinkModel) -> None:
        self._cfg = config
        self._profile = profile
        self._link = link

    def plan(self, now: float, view: ClusterView, forecasts: Sequence[Forecast], policy: str) -> Plan:
        p = self._cfg.planner
        demand = self._demand(forecasts)
        cancel = [o.order_id for o in view.active_orders
                  if o.spec.policy == policy and o.state is OrderState.ISSUED and o.spec.family not in demand]
        if not demand or view.families is None:
            return Plan([], cancel)
        live = {n.node_id: n for n in view.live_nodes()}
        queue = {n: v.queue_ms for n, v in live.items()}
        by_load = sorted(live, key=lambda n: (queue[n], n))
        landing = _landing(view)
        book = BudgetBook(view, self._cfg.budgets)
        families = [f for f in (self._family(view, name, d, live, queue, landing.get(name, set()))
                                for name, d in demand.items()) if f is not None and f.excess > 0]
        heap: list[tuple[float, int, int, NodeId]] = []
        for i, fam in enumerate(families):
            for target in _candidates(by_load, fam.nodes, p.candidates_per_family):
                entry = self._price(fam, live[target], queue, book)
                if entry is not None:
                    heapq.heappush(heap, (-entry[0], i, len(heap), target))
        return Plan(self._select(heap, families, live, queue, book, policy), cancel)

    def _demand(self, forecasts: Sequence[Forecast]) -> dict[Family, float]:
        p = self._cfg.planner
        figures: dict[Family, float] = {}
        for f in forecasts:
            d = f.upper_quantile if p.demand == "upper_quantile" else f.expected_count
            if d >= p.min_expected_requests and f.burst_probability >= p.min_burst_probability:
                figures[f.family] = max(figures.get(f.family, 0.0), d)
        top = sorted(figures.items(), key=lambda item: (-item[1], item[0]))[: p.max_families_per_tick]
        return dict(top)

    def _family(self, view: ClusterView, name: Family, demand: float, live: dict[NodeId, NodeView],
                queue: dict[NodeId, float], landing: set[NodeId]) -> _Family | None:
        profile = view.families.profile(name) if view.families else None
        if profile is None or not profile.chain:
            return None
        prompt = max(int(profile.prompt_tokens), 1)
        block_size = next(iter(live.values())).block_size
        full_ms = self._prefill(prompt, 0, block_size)
        # A node whose cached prefix saves less than a replica must save holds
        # only what the family shares with others (e.g. a system prompt every
        # conversation starts with): it is a candidate, not a holder.
        lengths = holders_of(view, profile, live, self._profile, self._cfg.planner.min_benefit_ms)
        # Holders mostly share a few prefix lengths: price each length once.
        priced: dict[int, float] = {}

        def prefill_at(length: int) -> float:
            ms = priced.get(length)
            if ms is None:
                ms = priced[length] = self._prefill(prompt, length, block_size)
            return ms

        if not lengths:
            return None  # nobody holds it: nothing to copy (the first request computes it)
        held = max(lengths.values())
        source = min((n for n, length in lengths.items() if length == held), key=lambda n: (queue[n], n))
        fam = _Family(name, demand, profile.chain[:held], prompt, source, held, demand,
                      full_ms, self._prefill(prompt, held, block_size),
                      frozenset(lengths) | landing)
        for node in sorted(fam.nodes, key=lambda n: (queue.get(n, 0.0), n)):
            if node not in live:
                continue
            per_request = prefill_at(lengths.get(node, held))
            take = min(fam.excess, self._capacity(queue[node], per_request))
            fam.excess -= take
            queue[node] += take * per_request  # this work is now spoken for
        return fam

    def _price(self, fam: _Family, target: NodeView, queue: dict[NodeId, float],
               book: BudgetBook) -> tuple[float, float, int] | None:
        """(benefit/cost, benefit, bytes) of a replica of fam on target, or None."""
        nbytes = fam.held_blocks * target.bytes_per_block
        transfer = self._link.transfer_ms(nbytes)
        absorbed = min(fam.excess, self._capacity(queue[target.node_id], fam.hit_ms, transfer))
        benefit = absorbed * (fam.full_ms - fam.hit_ms)
        if benefit < max(self._cfg.planner.min_benefit_ms, 1e-9):
            return None
        cost = book.cost(fam.source, target.node_id, fam.held_blocks, nbytes, self._cfg.planner.evict_weight)
        return benefit / max(cost, 1e-12), benefit, nbytes

    def _select(self, heap: list, families: list[_Family], live: dict[NodeId, NodeView],
                queue: dict[NodeId, float], book: BudgetBook, policy: str) -> list[OrderSpec]:
        orders: list[OrderSpec] = []
        chosen: set[tuple[Family, NodeId]] = set()
        limit = self._cfg.budgets.max_orders_per_tick
        while heap and len(orders) < limit:
            neg_ratio, i, tiebreak, target = heapq.heappop(heap)
            fam = families[i]
            if (fam.family, target) in chosen or fam.excess <= 0:
                continue
            priced = self._price(fam, live[target], queue, book)
            if priced is None:
                continue
            if priced[0] < -neg_ratio * (1 - 1e-9):
                heapq.heappush(heap, (-priced[0], i, tiebreak, target))  # got worse: re-rank
                continue
            if not book.fits(fam.source, target, fam.held_blocks, priced[2]):
                continue
            absorbed = priced[1] / (fam.full_ms - fam.hit_ms)
            book.take(fam.source, target, fam.held_blocks, priced[2])
            fam.excess -= absorbed
            queue[target] += absorbed * fam.hit_ms
            chosen.add((fam.family, target))
            orders.append(OrderSpec(fam.family, list(fam.chain), fam.source, target,
                                    self._cfg.leases.replica_lease_ms, priority=min(int(priced[1]), 2**31 - 1),
                                    expected_benefit_ms=priced[1], policy=policy))
        return orders

    def _capacity(self, queue_ms: float, per_request_ms: float, delay_ms: float = 0.0) -> float:
        """Requests a node can take within the horizon before their TTFT
        breaks the target. Zero when even one arriving now would miss it
        (queue + own prefill > T): the forecast does not say when in the
        horizon a request comes, and a single returning conversation may
        come at once, before the queue drains. delay_ms (a replica's
        transfer) shortens the window but not that test: a request arriving
        before the replica lands is served elsewhere anyway."""
        p = self._cfg.planner
        if queue_ms + per_request_ms > p.ttft_target_ms:
            return 0.0
        window = 1000.0 * p.horizon_s + p.ttft_target_ms - queue_ms - delay_ms
        return max(0.0, window / max(per_request_ms, 1e-9))

    def _prefill(self, prompt: int, cached_blocks: int, block_size: int) -> float:
        cached = min(cached_blocks * block_size, prompt - 1)
        return self._profile.prefill_ms(prompt - cached, cached)


def _landing(view: ClusterView) -> dict[Family, set[NodeId]]:
    out: dict[Family, set[NodeId]] = {}
    for order in view.active_orders:
        out.setdefault(order.spec.family, set()).add(order.spec.target)
    return out


def _candidates(by_load: list[NodeId], exclude: frozenset[NodeId], k: int) -> list[NodeId]:
    out = []
    for node in by_load:
        if node not in exclude:
            out.append(node)
            if len(out) == k:
                break
    return out
