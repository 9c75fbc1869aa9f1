"""The retain action: keep a conversation's KV on its holder until its
forecast return, when that is worth the pages it holds (ms of TTFT).

For each family with a RETENTION forecast (P = P(its next request comes
within `retain.ttl_s` of now), at least `retain.min_probability`; at most
`retain.max_families`, likeliest first):

- Holder: the live node holding the longest prefix of the family's chain
  worth at least `planner.min_benefit_ms` (ties: least queued). Nobody
  holds it: skipped. Retained there by this planner until at least
  now + ttl_s / 2: skipped (a retention is renewed once half of it has run).
- Time left d (s): when its blocks would leave that node without
  retention, from the family's last route (its last use) plus the node's
  residency, the time a just-used block takes to leave the node:
  device pages / device removal rate + host pages / host removal rate
  (reuse_history.py counts what leaves each tier; a tier nothing leaves
  holds it for good). d >= ttl_s: nothing to save.
- saving = P(the return comes in (d, ttl_s]) x (prefill without the prefix
  - the prefill and promotion with it): a return after d finds the prefix
  gone, one before d finds it anyway. With the forecast's curve (P(within
  t) at several t: the session-return model's survival curve, the oracle's
  true next arrival) and `retain.pricing` "curve", that is P(ttl_s) - P(d);
  otherwise ("uniform", the committed choice) the return is taken as
  uniform over the window, P x (1 - d / ttl_s). Queueing is left
  out (a retained prefix keeps its request on its busy holder, or spares it
  a recompute anywhere: either way the prefill term dominates).
- loss = eviction_ms(L, P(reuse) of the node's last tier, the family's
  recompute per block): while it lasts, the L pages it holds push L other
  blocks out of the node, each reused with the tier's observed chance.
  That P(reuse) is per removed block within `reuse.window_s` (W) of its
  removal. With `retain.displacement` "occupancy" the loss is scaled by
  H / W, H = held_past_s, the expected seconds the pages stay past d: a
  tier short of L pages for H seconds removes each block it removes in
  that time L / rate seconds early, which costs its reuse in that stretch,
  (L / rate) x rate x H x P(reuse) / W hits in all, taking reuses as
  uniform over W after removal (they cluster early, so this still
  underprices). "once" (the tier's chance, once) is the H = W case.
- Admitted when net > `planner.min_net_ms`, at most `retain.max_per_tick`
  per tick, largest net first, with lease ttl_s, within the node's
  retention budget: the node's kvstore
  retains at most `retain_max_blocks` at once (a share of its last tier,
  reported at registration; retention.py), and past it an order retains
  the chain's head only, which its price did not count. The planner keeps
  a shadow of each node's retention (services/common/retention.py, the
  store's own rule) holding what its retain orders asked for: a block
  already retained there costs nothing (chains that share a prefix share
  its blocks; a renewal re-retains its own), each new one a place under the
  cap. An order the shadow would keep only the head of is priced again for
  that head (the prefix a return would find) and admitted if that is still
  worth its pages. A node that reports no cap has no budget here.
  The shadow is an estimate of the store's retention, reconciled with what
  the node reports both ways it can be off:
  - emptier than the store, where the store holds retains the shadow never
    saw (an operator's RETAIN orders, a planner made anew by a scheduler
    restart or SetPolicy) or later deadlines (a live store counts its lease
    from when the order reached it): the node's heartbeat reports the
    blocks it retains (`retained_blocks`), and where that is more than the
    shadow holds, the rest take places under the cap too (taken to be
    blocks of no chain being priced, so it errs toward ordering less);
  - fuller than the store, where the store restarted empty: a node that
    registered again gets a new, empty shadow, and its families may be
    retained there anew at once. Where the store dropped
    retained blocks anyway (every candidate retained) the shadow stays
    fuller until those retains lapse, ordering less than would fit.
  The report is as old as the last heartbeat (a second or so): a retain
  ordered since is in the shadow and not in the report (so foreign retains
  are seen only beyond it), and one of the shadow's that lapsed since is in
  the report, so those are taken off the report before comparing (the
  shadow remembers what lapsed in the last LAPSE_LOG_S; a report older than
  that is taken as none). The count is dated when the scheduler received
  it, so the store's own lapses in between, and a live store's later
  deadlines, still read as others' for a moment: it errs toward less.

Pure: reads the view, keeps only the deadlines of the retentions it
ordered (so it does not order them again); time only from `now`.
"""
from __future__ import annotations

import math
from typing import Sequence

from speckv.services.common.ids import Family, NodeId
from speckv.services.common.retention import Retention
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.forecasts import Forecast, ForecastKind, p_within
from speckv.services.scheduler.policy_config import PolicyConfig
from speckv.services.scheduler.replication.family_options import OptionPricer
from speckv.services.scheduler.orders import ActionKind, OrderSpec
from speckv.services.scheduler.replication.value import eviction_ms
from speckv.services.scheduler.views import ClusterView, NodeView, holders_of

# How far back a shadow remembers the retentions that lapsed: longer than a
# node's report can be old while the node still counts as live.
LAPSE_LOG_S = 30.0


class RetentionPlanner:
    def __init__(self, config: PolicyConfig, pricer: OptionPricer) -> None:
        self._cfg = config
        self._pricer = pricer
        self._retained: dict[Family, tuple[NodeId, float]] = {}  # family -> (node, retained until, s)
        self._shadows: dict[NodeId, Retention] = {}  # what this planner's retains hold on each capped node
        self._generations: dict[NodeId, int] = {}  # the registration each shadow is of

    def plan(self, now: float, view: ClusterView, forecasts: Sequence[Forecast], policy: str) -> list[OrderSpec]:
        r = self._cfg.retain
        if not r.enabled or view.families is None:
            return []
        self._forget_lapsed(now)
        self._sync_shadows(view.nodes)
        chances = sorted(((f.expected_count, f.family, f.curve) for f in forecasts
                          if f.kind is ForecastKind.RETENTION and f.expected_count >= r.min_probability),
                         key=lambda item: (-item[0], item[1]))[:r.max_families]
        if not chances:
            return []
        live = {n.node_id: n for n in view.live_nodes()}
        residency = {n: self.residency_s(view, node, now) for n, node in live.items()}
        shortest = min(residency.values(), default=math.inf)
        priced: list[tuple[float, OrderSpec, float, tuple[tuple[float, float], ...]]] = []
        for p, family, curve in chances:
            held = self._retained.get(family)
            if held is not None and held[1] >= now + r.ttl_s / 2:
                continue
            profile = view.families.profile(family)
            if profile is None or profile.last_route + shortest - now >= r.ttl_s:
                continue  # safe for the whole window on any node: nothing to price
            spec = self._price(now, view, live, residency, family, min(p, 1.0), curve, policy)
            if spec is not None:
                priced.append((spec.expected_benefit_ms, spec, min(p, 1.0), curve))
        priced.sort(key=lambda item: (-item[0], item[1].family))
        orders: list[OrderSpec] = []
        for _, first, p, curve in priced:
            if len(orders) >= r.max_per_tick:
                break
            spec = self._fit(now, view, live, residency, first, p, curve, policy)
            if spec is not None:
                orders.append(spec)
                self._retained[spec.family] = (spec.target, now + r.ttl_s)
                shadow = self._shadows.get(spec.target)
                if shadow is not None:
                    shadow.retain(spec.block_hashes, now + r.ttl_s, now)
        return orders

    def _fit(self, now: float, view: ClusterView, live: dict[NodeId, NodeView], residency: dict[NodeId, float],
             first: OrderSpec, p: float, curve: tuple[tuple[float, float], ...], policy: str) -> OrderSpec | None:
        """first if its node's retention would keep all of it, else the head
        it would keep, priced again, or None when that head is not worth its
        pages."""
        shadow = self._shadows.get(first.target)
        node = live[first.target]
        # A count older than the shadow's lapse log could not be corrected for its lapses: unknown.
        fresh = node.retained_at is not None and now - node.retained_at <= LAPSE_LOG_S
        reported = (node.retained_blocks or 0) if fresh else 0
        kept = len(first.block_hashes) if shadow is None else \
            shadow.fits(first.block_hashes, now, reported, node.retained_at)
        if kept >= len(first.block_hashes):
            return first
        if kept <= 0:
            return None
        # The same view and holder as first's pricing: only the number of blocks changes.
        return self._price(now, view, live, residency, first.family, p, curve, policy, limit=kept)

    def _sync_shadows(self, nodes: Sequence[NodeView]) -> None:
        """One shadow per registered node that reports a cap (a node briefly
        silent keeps its own), new when the node registered again (its store
        may have restarted empty, or with another cap). The retentions this
        planner ordered on a node that registered again, or is gone, are
        forgotten too, so their families may be retained anew at once."""
        generations = {node.node_id: node.generation for node in nodes}
        reregistered = {n for n, g in self._generations.items() if generations.get(n) != g}
        if reregistered:
            self._retained = {f: held for f, held in self._retained.items() if held[0] not in reregistered}
        shadows = {}
        for node in nodes:
            cap = node.sizes.retain_max_blocks
            if cap is None:
                continue
            shadow = self._shadows.get(node.node_id)
            kept = shadow is not None and shadow.max_blocks == cap and node.node_id not in reregistered
            shadows[node.node_id] = shadow if kept and shadow is not None else Retention(cap, LAPSE_LOG_S)
        self._shadows, self._generations = shadows, generations

    def _price(self, now: float, view: ClusterView, live: dict[NodeId, NodeView], residency: dict[NodeId, float],
               family: Family, p: float, curve: tuple[tuple[float, float], ...], policy: str,
               limit: int | None = None) -> OrderSpec | None:
        """The order retaining family's chain at its best holder, at most its
        first `limit` blocks, or None when it is not worth its pages."""
        assert view.families is not None
        profile = view.families.profile(family)
        if profile is None or not profile.chain:
            return None
        held = holders_of(view, profile, live, self._pricer.profile, self._cfg.planner.min_benefit_ms)
        if not held:
            return None
        node_id = min(held, key=lambda n: (-held[n], live[n].queue_ms, n))
        node, blocks = live[node_id], held[node_id] if limit is None else min(held[node_id], limit)
        if blocks <= 0:
            return None
        ttl_s = self._cfg.retain.ttl_s
        left_s = max(0.0, profile.last_route + residency[node_id] - now)
        if left_s >= ttl_s:
            return None
        prompt = max(int(profile.prompt_tokens), 1)
        full_ms = self._pricer.prefill_ms(prompt, 0, node.block_size)
        host_only = view.index.host_only_count(node_id, profile.chain, blocks)
        hit_ms = (self._pricer.prefill_ms(prompt, blocks, node.block_size)
                  + self._pricer.promote_ms(host_only, node.bytes_per_block))
        if curve and self._cfg.retain.pricing == "curve":
            after = max(0.0, p - p_within(curve, left_s))
        else:
            after = p * (1.0 - left_s / ttl_s)
        saving = after * max(0.0, full_ms - hit_ms)
        last_tier = Tier.HOST if node.sizes.host_pages else Tier.DEVICE
        p_reuse = view.reuse.p_reuse(node_id, last_tier, now) if view.reuse else 1.0
        loss = eviction_ms(blocks, p_reuse, full_ms / max(1.0, prompt / node.block_size))
        if self._cfg.retain.displacement == "occupancy":
            loss *= held_past_s(p, left_s, ttl_s) / self._cfg.reuse.window_s
        net = saving - loss
        if net <= self._cfg.planner.min_net_ms:
            return None
        return OrderSpec(family, list(profile.chain[:blocks]), node_id, node_id, int(ttl_s * 1000),
                         priority=min(int(net), 2**31 - 1), expected_benefit_ms=net, policy=policy,
                         tier=last_tier, action=ActionKind.RETAIN, forecast=ForecastKind.RETENTION.value)

    @staticmethod
    def residency_s(view: ClusterView, node: NodeView, now: float) -> float:
        """How long a block just used on node stays on it (s): the time to
        age through each tier at the rate blocks leave it (inf if nothing
        leaves a tier, or no removal history is kept)."""
        reuse = view.reuse
        if reuse is None:
            return math.inf
        total = 0.0
        for tier, pages in ((Tier.DEVICE, node.sizes.device_pages), (Tier.HOST, node.sizes.host_pages)):
            if pages <= 0:
                continue
            rate = reuse.removal_rate(node.node_id, tier, now)
            if rate <= 0.0:
                return math.inf
            total += pages / rate
        return total

    def _forget_lapsed(self, now: float) -> None:
        if len(self._retained) > 4 * self._cfg.retain.max_families:
            self._retained = {f: v for f, v in self._retained.items() if v[1] > now}


def held_past_s(p: float, left_s: float, ttl_s: float) -> float:
    """Expected seconds a retain keeps its blocks past the time left_s they
    would have left (s): all of ttl_s - left_s when the conversation does
    not come back (chance 1 - p), until its return when that comes after
    left_s (the return uniform over the window), nothing when it comes
    before. 0 <= result <= ttl_s - left_s."""
    rest = max(0.0, ttl_s - left_s)
    p = min(max(p, 0.0), 1.0)
    return (1.0 - p) * rest + p * rest * rest / (2.0 * ttl_s)
