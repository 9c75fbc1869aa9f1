"""An analysis, not a policy: is the retain price's time-left d right, and
where does its expected saving go? Runs POLICY on a trace slice with every
retain priced but none ordered (so the run is the run without retain, and
the blocks age as the price assumed), recording for each order the planner
would have placed: its P, its d (the family's last route + the node's
residency - now) and its chain; and for every block, when it left the node
(a REMOVED event of the host tier). Then, per order, when the chain's last
block (LRU takes a chain tail first) actually left, and when the family
came back. Runs on the source (it patches the planner):

    .venv/bin/python docs/scripts/retain_residency.py \
        ../shared/traces/mooncake_conversation_trace.jsonl 1200 2476 8 predictive

Prints: d's error (actual tail departure / d) for orders whose family did
not come back within the window (so nothing refreshed the blocks), the
expected returns (sum of P) against the actual, and the expected rescues
(P x (1 - d / ttl), the committed uniform pricing) against the returns that
came after d and after the tail actually left.
"""
import json
import math
import sys
from collections import defaultdict

import numpy as np
from synthetic_slice import trace_slice

from speckv.services.common.tiers import Tier
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.replication import retention_plan

trace, start, end, nodes, policy = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
TTL = load_policy_config().retain.ttl_s
piece = trace_slice(trace, nodes, start, end)

priced = []
plan = retention_plan.RetentionPlanner.plan


def pricing_only(self, now, view, forecasts, policy):
    """Plans as the policy would (its ledger and budget included), records the
    orders, and returns none of them."""
    chance = {f.family: min(f.expected_count, 1.0) for f in forecasts}
    nodes_by_id = {n.node_id: n for n in view.nodes}
    for spec in plan(self, now, view, forecasts, policy):
        residency = self.residency_s(view, nodes_by_id[spec.target], now)
        left = max(0.0, view.families.profile(spec.family).last_route + residency - now)
        priced.append((now, spec.family, spec.target, left, list(spec.block_hashes), chance[spec.family]))
    return []


retention_plan.RetentionPlanner.plan = pricing_only
sim = piece.simulation(policy)
left_node = defaultdict(list)  # (node, block hash) -> times it left the node
reuse = sim.core._reuse
removed = reuse.removed


def recording_removed(node, tier, hashes, now):
    if tier is Tier.HOST:
        for h in hashes:
            left_node[(node, h)].append(now)
    return removed(node, tier, hashes, now)


reuse.removed = recording_removed
records = [r for r in sim.run().records if r.served]
arrivals = defaultdict(list)
for r in records:
    arrivals[r.family].append(r.arrival_s)
rows = []
for t0, family, node, left, blocks, p in priced:
    if t0 >= end - TTL:
        continue  # its window runs past the slice: its return is not known
    gone = [t for t in left_node.get((node, blocks[-1]), []) if t >= t0]
    later = [a for a in arrivals[family] if a > t0]
    rows.append((p, left, min(gone) - t0 if gone else math.inf, min(later) - t0 if later else math.inf))
p, left, tail, back = (np.array(column) for column in zip(*rows))
quiet = back > TTL
ratio = tail[quiet & np.isfinite(tail)] / np.maximum(left[quiet & np.isfinite(tail)], 1.0)
print(json.dumps({
    "orders_priced": len(rows),
    "d_s_quantiles_10_25_50_75_90": np.percentile(left, [10, 25, 50, 75, 90]).round(1).tolist(),
    "no_return_in_window": int(quiet.sum()),
    "of_them_tail_left_within_ttl": round(float(np.mean(tail[quiet] <= TTL)), 3),
    "actual_over_d_quantiles_10_25_50_75_90": np.percentile(ratio, [10, 25, 50, 75, 90]).round(2).tolist(),
    "expected_returns_sum_p": round(float(p.sum())), "actual_returns": int((back <= TTL).sum()),
    "expected_rescues_uniform": round(float((p * (1 - left / TTL)).sum())),
    "returns_after_d": int(((back > left) & (back <= TTL)).sum()),
    "returns_after_tail_left": int(((back > tail) & (back <= TTL)).sum()),
    "return_delay_s_quantiles_10_25_50_75_90": np.percentile(back[back <= TTL], [10, 25, 50, 75, 90]).round(0).tolist(),
}, indent=1))
