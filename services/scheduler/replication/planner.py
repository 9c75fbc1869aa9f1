"""The planner: forecasts + cluster state -> speculative orders, each
admitted only when it is expected to save more TTFT than it costs (ms).

Each tick, for the families forecast to bring at least
`min_expected_requests` requests (family bursts) or to return with
probability `min_return_probability` (session returns) within their
forecast's horizon (demand =
the forecast's expected count or upper quantile, per `demand`, spread over
that horizon; a session-return forecast's count is the probability that the
conversation returns within its horizon; a family with a burst forecast
above its floor keeps that one, the near-term count being what a burst's
queueing depends on, else its larger figure; at most
`max_families_per_tick`, largest first):

1. Options. How the family's requests would be served now
   (family_options.py): its holders (promoting host-only blocks first), and
   recompute or a pull on `candidates_per_family` other nodes: those still
   ramping after joining a serving cluster first (routing/join_ramp.py: the
   share of demand they are about to take is what pre-warming them is for),
   then the least queued. A family nobody holds has nothing to copy: it is skipped.
2. Candidates. Replicate its longest held prefix to each of those
   non-holders, into their host tier and (if `replicate_to_device`) their
   device tier; prefetch the host-only blocks of each holder's prefix into
   its device tier. With `redundancy`, when the longest held prefix has
   exactly one live holder, also a redundant copy of it to each of those
   non-holders, into their host tier (device tier when they have none).
   With `stage` and a disk model (the scheduler's --disk-gbps), stage the
   blocks of each holder's prefix that only its disk holds into its host
   tier, read ahead of the forecast requests, unless a stage of the family
   is in flight there (issue 44; a holder's disk blocks are priced as disk
   reads behind its disk's backlog in its option and in a prefetch too).
3. Value (value.py), for families whose expected TTFT now exceeds what
   every request hitting the whole prefix on an idle node would take by
   more than `min_net_ms` (no load action can save more than that gap;
   a redundant copy could, and is not priced for the others either:
   redundancy.py):
   saving = expected TTFT of the family's forecast
   requests without the candidate minus with it; minus the evictions it
   causes (blocks beyond the tier's free pages x P(reuse) from the reuse
   history x the cost of that reuse; for the device tier, also the blocks
   its demotions push out of a full host tier, at their recompute) minus the delay its transfer adds to
   pulls on its links (a stage's read: to the disk loads routed to its node), and, with `queue_externality`, minus the queueing
   the work it moves onto a node adds to the others routed there
   (value.queue_externality_ms; off in the committed configuration), and,
   for a copy, `copy_ms_per_gib` for each GiB it sends over the network
   (the price of speculative bytes, policies.json says why). Nothing is capped at the TTFT target: fanning out
   is worth what the queueing it avoids is worth. A redundant copy's
   saving is another term (redundancy.py): P(the sole holder fails within
   the demand horizon, at `failure_rate_per_node_hour`) x the TTFT the copy
   saves the forecast requests when that holder is gone, counted only when
   it reaches `redundancy_min_saving_ms`; its eviction and link prices are
   the replica's.
4. Greedy by net ms (lazy: a popped candidate is re-priced against what
   this tick already chose for its family and tier, and pushed back if it
   got worse), admitted only with net > `min_net_ms` and, for copies,
   within the link and memory budgets (budgets.py); at most
   `max_orders_per_tick` orders, one per (action, family, node). A chosen
   action's option joins its family's options, the work its family's
   requests would give its node joins that node's queue, and a copy's
   transfer joins both its links' backlog, for every candidate priced
   after it. A target of a copy still landing counts as a holder already
   (a simplification: it serves only once the copy lands), so a family
   gets at most one redundant copy, and none once it has two holders.
5. Cancellation. Orders of this policy still ISSUED whose family is no
   longer among this tick's demand (not forecast, below its floor, or
   outside the top `max_families_per_tick`) are cancelled (not yet
   started, so nothing is lost).

Replicas carry `leases.replica_lease_ms`; a prefetch or a stage carries
the same lease as its deadline (its blocks become the most recently used of
the tier it brought them to, nothing more). The third action, retain (keep a holder's
prefix from leaving it for `retain.ttl_s`), is priced apart on the
RETENTION forecasts (retention_plan.py) and its orders join the plan; they
are never cancelled here (they run as soon as a node takes them). Pure: no
I/O, time only from `now`.
"""
from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Sequence

from speckv.services.common.engine_profile import EngineProfile, LinkModel
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.forecasts import Forecast, ForecastKind
from speckv.services.scheduler.policy_config import PolicyConfig
from speckv.services.scheduler.replication.budgets import BudgetBook
from speckv.services.scheduler.replication.family_options import (
    ActionCandidate,
    FamilyState,
    OptionPricer,
    free_pages,
)
from speckv.services.scheduler.replication.insurance import insurance_ms, surge_demand, surge_probability
from speckv.services.scheduler.orders import ActionKind, OrderSpec, OrderState
from speckv.services.scheduler.replication.redundancy import failover_saving_ms, failure_probability
from speckv.services.scheduler.replication.retention_plan import RetentionPlanner
from speckv.services.scheduler.replication.value import (
    ActionValue,
    Demand,
    ServeOption,
    eviction_ms,
    link_delay_ms,
    queue_externality_ms,
    walk,
)
from speckv.services.scheduler.views import ClusterView, NodeView, Plan, holders_of


class Planner:
    def __init__(self, config: PolicyConfig, profile: EngineProfile, link: LinkModel,
                 host_link: LinkModel | None = None, disk: LinkModel | None = None) -> None:
        self._cfg = config
        self._pricer = OptionPricer(profile, link, host_link, disk)
        self._retention = RetentionPlanner(config, self._pricer)

    def plan(self, now: float, view: ClusterView, forecasts: Sequence[Forecast], policy: str) -> Plan:
        demand = self._demand(forecasts)
        cancel = [o.order_id for o in view.active_orders
                  if o.spec.policy == policy and o.state is OrderState.ISSUED and o.spec.family not in demand
                  and o.spec.action is not ActionKind.RETAIN]
        retains = self._retention.plan(now, view, forecasts, policy)
        if not demand or view.families is None:
            return Plan(retains, cancel)
        tick = _Tick(self, now, view)
        if not tick.live:
            return Plan(retains, cancel)
        for name, (count, horizon_s, kind) in demand.items():
            tick.add_family(name, Demand(count, 1000.0 * horizon_s), kind)
        return Plan(tick.select(policy) + retains, cancel)

    def _demand(self, forecasts: Sequence[Forecast]) -> dict[Family, tuple[float, float, ForecastKind]]:
        """family -> (requests expected, within seconds, the kind of the forecast that said so)."""
        p = self._cfg.planner
        figures: dict[Family, tuple[float, float, bool]] = {}  # (count, horizon s, a burst)
        for f in forecasts:
            if f.kind is ForecastKind.RETENTION:
                continue  # the retain step's (retention_plan.py)
            d = f.upper_quantile if p.demand == "upper_quantile" else f.expected_count
            burst = f.kind is ForecastKind.BURST
            floor = p.min_expected_requests if burst else p.min_return_probability
            if d < floor or f.burst_probability < p.min_burst_probability:
                continue
            old = figures.get(f.family)
            if old is None or (burst, d) > (old[2], old[0]):
                figures[f.family] = (d, f.horizon_s, burst)
        top = sorted(figures.items(), key=lambda item: (-item[1][0], item[0]))[: p.max_families_per_tick]
        return {family: (count, horizon, ForecastKind.BURST if burst else ForecastKind.RETURN)
                for family, (count, horizon, burst) in top}


class _Tick:
    """One plan() call: the families, their candidates and what was chosen."""

    def __init__(self, planner: Planner, now: float, view: ClusterView) -> None:
        self.cfg, self.pricer, self.now, self.view = planner._cfg, planner._pricer, now, view
        self.live: dict[NodeId, NodeView] = {n.node_id: n for n in view.live_nodes()}
        self.queue = {n: v.queue_ms for n, v in self.live.items()}
        # Joining nodes first (pre-warm), then the least queued.
        self.by_load = sorted(self.live, key=lambda n: (n not in view.joining, self.queue[n], n))
        self.link_wait = dict(view.link_wait_ms)
        self.book = BudgetBook(view, self.cfg.budgets)
        self.planned: dict[tuple[NodeId, Tier], int] = {}  # blocks this tick put in a tier
        self.forecast: dict[Family, ForecastKind] = {}  # the kind of forecast each family's demand came from
        self.landing: dict[Family, set[NodeId]] = {}
        self.staging: dict[Family, set[NodeId]] = {}  # stages in flight (a request there joins their read)
        for order in view.active_orders:
            self.landing.setdefault(order.spec.family, set()).add(order.spec.target)
            if order.spec.action is ActionKind.STAGE:
                self.staging.setdefault(order.spec.family, set()).add(order.spec.target)
        self.disk_wait = dict(view.disk_wait_ms)  # until each disk is free (disk_backlog.py), with this tick's stages
        self.families: list[FamilyState] = []
        self.baseline: list[float] = []  # each family's expected TTFT (ms) with its current options
        self.base_work: list[dict[str, float]] = []  # and the prefill work (ms) it gives each node
        self.surge: list[tuple[float, Demand] | None] = []  # each family's (P(surge within the insured life), surge)
        rates = (view.families.node_route_rates(now)
                 if view.families is not None and self.cfg.planner.queue_externality else {})
        self.route_rates: dict[str, float] = {node: r for node, r in rates.items()}  # keyed as walk's work
        # (-net ms, network bytes, insertion order, candidate): among equal
        # nets, the action moving fewer bytes over the network goes first.
        self.heap: list[tuple[float, int, int, ActionCandidate]] = []

    def add_family(self, name: Family, demand: Demand, kind: ForecastKind) -> None:
        """Prices the candidates of family `name`, whose demand a forecast of `kind` set."""
        self.forecast[name] = kind
        fam = self._family(name, demand)
        if fam is None:
            return
        baseline, work = walk(fam.options, fam.demand)
        surge = self._surge_outlook(name)
        # No action can do better than every request hitting the whole
        # prefix at once on an idle node: families already served about that
        # well (most, most of the time) are not worth pricing candidates for,
        # unless a surge to come may need a second holder.
        if baseline - fam.demand.count * fam.hit_ms <= self.cfg.planner.min_net_ms and surge is None:
            return
        index = len(self.families)
        self.families.append(fam)
        self.baseline.append(baseline)
        self.base_work.append(work)
        self.surge.append(surge)
        for candidate in self._candidates(fam, index):
            value = self.value(candidate)
            if value.net_ms > self.cfg.planner.min_net_ms:
                heapq.heappush(self.heap, (-value.net_ms, _network_bytes(candidate), len(self.heap), candidate))

    def _surge_outlook(self, name: Family) -> tuple[float, Demand] | None:
        """(P(the family surges within the insured life), that surge) for a
        family that surged before and is not surging now (insurance.py)."""
        life_s = self.cfg.planner.insurance_life_s
        families = self.view.families
        if life_s <= 0 or families is None:
            return None
        history = families.surge_history(name, self.now)
        if history is None or history.surging:
            return None
        p = surge_probability(history, life_s)
        demand = surge_demand(history, self.cfg.families.recent_window_s, self.cfg.planner.horizon_s)
        return (p, demand) if p > 0 else None

    def _family(self, name: Family, demand: Demand) -> FamilyState | None:
        view, p = self.view, self.cfg.planner
        profile = view.families.profile(name) if view.families else None
        if profile is None or not profile.chain:
            return None
        held = holders_of(view, profile, self.live, self.pricer.profile, p.min_benefit_ms)
        if not held:
            return None  # nobody holds it: nothing to copy (the first request computes it)
        prompt = max(int(profile.prompt_tokens), 1)
        longest = max(held.values())
        source = min((n for n, k in held.items() if k == longest), key=lambda n: (self.queue[n], n))
        block_size = self.live[source].block_size
        host_only = {n: view.index.host_only_count(n, profile.chain, k) for n, k in held.items()}
        disk_only = ({n: view.index.disk_only_count(n, profile.chain, held[n]) for n, k in host_only.items() if k}
                     if self.pricer.prices_disk else {})
        for node in self.landing.get(name, ()):
            if node in self.live and node not in held:
                held[node] = longest  # a copy landing there serves like a holder
        # In node order: the walk gives a tie to the first option, and the
        # index lists equal holders (and landing is a set) in string-hash order,
        # which differs per process; the queue externality prices each node apart.
        held = dict(sorted(held.items()))
        full_ms = self.pricer.prefill_ms(prompt, 0, block_size)
        fam = FamilyState(name, demand, list(profile.chain[:longest]), prompt,
                          source, host_only[source], held, host_only, [], full_ms,
                          self.pricer.prefill_ms(prompt, longest, block_size),
                          full_ms / max(1.0, prompt / block_size), disk_only=disk_only,
                          source_disk_only=disk_only.get(source, 0),
                          disk_wait={n: self.disk_wait.get(n, 0.0) for n, d in disk_only.items() if d},
                          staging=set(self.staging.get(name, ())))
        fam.options = self.pricer.serve_options(fam, self.live, self.queue, self._spill(fam), self.link_wait)
        return fam

    def _spill(self, fam: FamilyState) -> list[NodeId]:
        out = []
        for node in self.by_load:
            if node not in fam.held:
                out.append(node)
                if len(out) == self.cfg.planner.candidates_per_family:
                    break
        return out

    def _candidates(self, fam: FamilyState, index: int) -> list[ActionCandidate]:
        p = self.cfg.planner
        out: list[ActionCandidate] = []
        for node in self._spill(fam) if p.replicate else ():
            target = self.live[node]
            tiers = ([Tier.HOST] if target.sizes.host_pages else []) + ([Tier.DEVICE] if p.replicate_to_device
                                                                       or not target.sizes.host_pages else [])
            for tier in tiers:
                out.append(self.pricer.replica(fam, index, target, tier, self.queue[node], self.link_wait))
        if p.redundancy and p.failure_rate_per_node_hour > 0 and self._sole_holder(fam) \
                and self._redundancy_could_pay(fam):
            for node in self._spill(fam):
                target = self.live[node]
                tier = Tier.HOST if target.sizes.host_pages else Tier.DEVICE
                out.append(self.pricer.replica(fam, index, target, tier, self.queue[node], self.link_wait,
                                               ActionKind.REDUNDANT))
        if p.prefetch:
            for node in fam.held:
                if node in self.live:
                    candidate = self.pricer.prefetch(fam, index, self.live[node], self.queue[node])
                    if candidate is not None:
                        out.append(candidate)
        if p.stage:
            for node, blocks in fam.disk_only.items():
                if blocks and node in self.live:
                    candidate = self.pricer.stage(fam, index, self.live[node], self.queue[node],
                                                  self.disk_wait.get(node, 0.0))
                    if candidate is not None:
                        out.append(candidate)
        return out

    def _redundancy_could_pay(self, fam: FamilyState) -> bool:
        """An upper bound on any redundant copy's saving reaches the floor:
        with the holder gone no request waits longer than the longest queue
        plus every forecast request's prefill from nothing ahead of it. At
        published failure rates the bound stays
        far below the floor, and the copies are not priced at all (their
        walks cost CPU)."""
        p = self.cfg.planner
        p_fail = failure_probability(p.failure_rate_per_node_hour, fam.demand.horizon_ms)
        worst_ms = max(self.queue.values(), default=0.0) + (fam.demand.count + 1.0) * fam.full_ms
        return p_fail * fam.demand.count * worst_ms >= max(p.redundancy_min_saving_ms, 1e-300)

    def _sole_holder(self, fam: FamilyState) -> bool:
        """Exactly one node holds (or is being given) the whole of L*."""
        return sum(1 for k in fam.held.values() if k >= len(fam.chain)) == 1

    def current(self, c: ActionCandidate) -> ServeOption:
        """c's option as things stand now: its node's queue with the work
        this tick's chosen actions gave it, a copy's landing behind the
        copies this tick already put on its links."""
        fam = self.families[c.family_index]
        if c.kind.copies:
            wait = max(self.link_wait.get(fam.source, 0.0), self.link_wait.get(c.node, 0.0))
            return replace(c.option, queue_ms=self.queue[c.node], ready_ms=wait + c.transfer_ms)
        if c.kind is ActionKind.STAGE:  # behind the reads on its disk, this tick's stages included
            ready = self.disk_wait.get(c.node, 0.0) + c.transfer_ms
            return replace(c.option, queue_ms=self.queue[c.node], ready_ms=ready)
        return replace(c.option, queue_ms=self.queue[c.node])

    def value(self, c: ActionCandidate) -> ActionValue:
        """c's net worth against this tick's choices so far (ms; value.py,
        and redundancy.py for a redundant copy)."""
        fam = self.families[c.family_index]
        if c.kind is ActionKind.REDUNDANT:
            p_fail = failure_probability(self.cfg.planner.failure_rate_per_node_hour, fam.demand.horizon_ms)
            saving = failover_saving_ms(fam.options, self.current(c), fam.source, fam.demand, p_fail)
            if saving < self.cfg.planner.redundancy_min_saving_ms:
                saving = 0.0  # no evidence it pays: refused whatever its price (a free copy costs 0)
            return ActionValue(saving, self._eviction_ms(c, fam), self._link_ms(c, fam),
                               bytes_ms=self._bytes_ms(c))
        option = self.current(c)
        with_ms, work = walk(fam.options + [option], fam.demand)
        saving = self.baseline[c.family_index] - with_ms
        queue = (queue_externality_ms(self.base_work[c.family_index], work, self.route_rates)
                 if self.route_rates else 0.0)
        surge = self.surge[c.family_index]
        insured = insurance_ms(fam.options, option, surge[1], surge[0]) \
            if surge is not None and c.kind is ActionKind.REPLICATE else 0.0
        return ActionValue(saving, self._eviction_ms(c, fam), self._link_ms(c, fam), queue, self._bytes_ms(c),
                           insured)

    def _bytes_ms(self, c: ActionCandidate) -> float:
        """The price of the bytes c sends over the network (ms; 0 for a prefetch or a stage)."""
        return self.cfg.planner.copy_ms_per_gib * _network_bytes(c) / 2**30

    def _eviction_ms(self, c: ActionCandidate, fam: FamilyState) -> float:
        """What the blocks c pushes out of its tier (and, from a device tier,
        out of a full host tier below) cost their reuse (ms)."""
        node = self.live[c.node]
        evicted = max(0, c.blocks - self._room(c.node, c.tier))
        loss = eviction_ms(evicted, self._p_reuse(c.node, c.tier), self.pricer.miss_ms_per_block(fam, node, c.tier))
        if c.tier is Tier.DEVICE and node.sizes.host_pages and evicted:
            # Its demotions land in a host tier that may be full: what they push
            # out of it leaves the node.
            dropped = max(0, evicted - self._room(c.node, Tier.HOST))
            loss += eviction_ms(dropped, self._p_reuse(c.node, Tier.HOST),
                                self.pricer.miss_ms_per_block(fam, node, Tier.HOST))
        return loss

    def _link_ms(self, c: ActionCandidate, fam: FamilyState) -> float:
        """The delay c's transfer adds to the pulls on both its links (ms);
        a stage's, the delay its read adds to the disk loads on its node."""
        if not c.transfer_ms:
            return 0.0
        if c.kind is ActionKind.STAGE:
            return link_delay_ms(c.transfer_ms, [self.view.disk_loads_per_s.get(c.node, 0.0)])
        rates = self.view.pulls_per_s
        return link_delay_ms(c.transfer_ms, [rates.get(fam.source, 0.0), rates.get(c.node, 0.0)])

    def _room(self, node: NodeId, tier: Tier) -> int:
        return free_pages(self.live[node], tier) - self.planned.get((node, tier), 0)

    def _p_reuse(self, node: NodeId, tier: Tier) -> float:
        return self.view.reuse.p_reuse(node, tier, self.now) if self.view.reuse else 1.0

    def select(self, policy: str) -> list[OrderSpec]:
        orders: list[OrderSpec] = []
        limit, floor = self.cfg.budgets.max_orders_per_tick, self.cfg.planner.min_net_ms
        while self.heap and len(orders) < limit:
            neg_net, nbytes, tiebreak, c = heapq.heappop(self.heap)
            fam = self.families[c.family_index]
            if (c.kind, c.node) in fam.chosen or (c.kind.copies and c.node in fam.held) \
                    or (c.kind is ActionKind.REDUNDANT and not self._sole_holder(fam)):
                continue
            value = self.value(c)
            if value.net_ms <= floor:
                continue
            if value.net_ms < -neg_net * (1 - 1e-9) and self.heap and value.net_ms < -self.heap[0][0]:
                heapq.heappush(self.heap, (-value.net_ms, nbytes, tiebreak, c))  # got worse: re-rank
                continue
            if c.kind.copies:
                if not self.book.fits(fam.source, c.node, c.blocks, c.nbytes):
                    continue
                self.book.take(fam.source, c.node, c.blocks, c.nbytes)
                fam.held[c.node] = len(fam.chain)
            orders.append(self._accept(fam, c, value, policy))
        return orders

    def _accept(self, fam: FamilyState, c: ActionCandidate, value: ActionValue, policy: str) -> OrderSpec:
        fam.chosen.add((c.kind, c.node))
        option = self.current(c)
        fam.options.append(option)
        self.baseline[c.family_index], work = walk(fam.options, fam.demand)
        self.base_work[c.family_index] = work
        demoted = max(0, c.blocks - self._room(c.node, c.tier)) if c.tier is Tier.DEVICE else 0
        self.planned[(c.node, c.tier)] = self.planned.get((c.node, c.tier), 0) + c.blocks
        if demoted and self.live[c.node].sizes.host_pages:
            self.planned[(c.node, Tier.HOST)] = self.planned.get((c.node, Tier.HOST), 0) + demoted
        self.queue[c.node] += work.get(c.node, 0.0)  # what its requests will keep the node busy with
        if c.kind.copies:
            self.link_wait[fam.source] = self.link_wait[c.node] = option.ready_ms
        elif c.kind is ActionKind.STAGE:
            self.disk_wait[c.node] = option.ready_ms
        source = fam.source if c.kind.copies else c.node
        chain = fam.chain if c.kind.copies else fam.chain[:fam.held[c.node]]
        lease_ms = self.cfg.leases.replica_lease_ms
        if value.insurance_ms > value.saving_ms:  # bought for the surge to come: leased for the life insured
            lease_ms = max(lease_ms, int(self.cfg.planner.insurance_life_s * 1e3))
        return OrderSpec(fam.family, list(chain), source, c.node, lease_ms,
                         priority=min(int(value.net_ms), 2**31 - 1), expected_benefit_ms=value.net_ms,
                         policy=policy, tier=c.tier, action=c.kind, forecast=self.forecast[fam.family].value)


def _network_bytes(c: ActionCandidate) -> int:
    return c.nbytes if c.kind.copies else 0
