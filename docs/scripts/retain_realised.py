"""An analysis, not a policy: what the retain orders of a run came to at the
store. Runs POLICY on a trace slice and counts (1) the retains the node's
store clipped to its cap (`Retention.retain` keeping fewer blocks than the
order named: only the chain's head), and (2) for every retain order whose
conversation came back within its lease, whether that return was routed to
the retaining node and found at least 90 % of the retained chain there.
Runs on the source (it patches each simulated store's Retention):

    .venv/bin/python docs/scripts/retain_realised.py \\
        ../shared/traces/mooncake_conversation_trace.jsonl 1200 2476 8 predictive
"""
import json
import sys
from collections import Counter, defaultdict

from synthetic_slice import trace_slice

from speckv.services.scheduler.orders import ActionKind

trace, start, end, nodes, policy = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
piece = trace_slice(trace, nodes, start, end)
config = piece.config

sim = piece.simulation(policy)
calls = []  # (blocks asked, blocks kept) of each retain a node's store executed (not the planner's shadow)


def counting(store_retention):
    retain = store_retention.retain

    def counting_retain(hashes, until, now):
        kept = retain(hashes, until, now)
        calls.append((len(hashes), kept))
        return kept
    return counting_retain


for kv in sim.kv.values():
    if kv._retention is not None:
        kv._retention.retain = counting(kv._retention)
records = [r for r in sim.run().records if r.served]
tracker = sim.core._orders  # an analysis script may read the tracker's log directly
orders = [o for o in [*tracker._done.values(), *tracker._active.values()] if o.spec.action is ActionKind.RETAIN]
by_family = defaultdict(list)
for r in records:
    by_family[r.family].append(r)
outcomes = Counter()
block_tokens = config.block_tokens
for o in orders:
    t0, t1 = o.created_at, o.created_at + o.spec.lease_ms / 1000.0
    back = sorted((r for r in by_family[o.spec.family] if t0 < r.arrival_s <= t1), key=lambda r: r.arrival_s)
    if not back:
        outcomes["no return in its lease"] += 1
    elif back[0].node_id != o.spec.target:
        outcomes["came back, routed to another node"] += 1
    elif back[0].cached_tokens + back[0].fetched_tokens >= 0.9 * len(o.spec.block_hashes) * block_tokens:
        outcomes["came back to it, >= 90 % of the chain cached"] += 1
    else:
        outcomes["came back to it, less cached"] += 1
print(json.dumps({
    "retain_orders": len(orders), "store_retain_calls": len(calls),
    "clipped_by_the_cap": sum(kept < asked for asked, kept in calls),
    "blocks_asked": sum(asked for asked, _ in calls), "blocks_retained": sum(kept for _, kept in calls),
    **outcomes}, indent=1))
