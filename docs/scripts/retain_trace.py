"""An analysis, not a policy: where the retain action's measured saving goes
on a trace, request by request. Runs POLICY and POLICY-without-retain on
the trace from START (loadgen/sim/ablation.py) and splits the requests into
those of a conversation with a retain order in force when they arrived on
the node the order named ("covered": what the planner priced) and the
rest; for the covered ones, whether the run without retain found the
prefix cached anyway (the planner counted a saving only for returns after
the blocks would have gone) and the TTFT difference, for the rest the
difference the retains' displaced KV and rerouting made:

    .venv/bin/python docs/scripts/retain_trace.py ../shared/traces/mooncake_conversation_trace.jsonl 2476 8 predictive
"""
import json
import sys

import numpy as np
from synthetic_slice import trace_slice

from speckv.services.scheduler.orders import ActionKind

trace, start, nodes, policy = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
chosen = trace_slice(trace, nodes, start, float("inf"))


def run(name):
    sim = chosen.simulation(name)
    records = {r.request_id: r for r in sim.run().records if r.served}
    tracker = sim.core._orders  # an analysis script may read the tracker's log directly
    retains = [o for o in [*tracker._done.values(), *tracker._active.values()] if o.spec.action is ActionKind.RETAIN]
    return records, retains


with_, retains = run(policy)
without, _ = run(f"{policy}-without-retain")
windows: dict = {}
for o in retains:
    windows.setdefault(o.spec.family, []).append((o.created_at, o.created_at + o.spec.lease_ms / 1000.0,
                                                   o.spec.target, o.spec.expected_benefit_ms))
common = sorted(set(with_) & set(without))


def covered(r) -> bool:
    return any(t0 <= r.arrival_s <= t1 and node == r.node_id for t0, t1, node, _ in windows.get(r.family, ()))


def cached(r) -> int:
    return r.cached_tokens + r.fetched_tokens


cov = [k for k in common if covered(with_[k])]
rest = [k for k in common if k not in set(cov)]
d_cov = np.array([without[k].ttft_ms - with_[k].ttft_ms for k in cov])
d_rest = np.array([without[k].ttft_ms - with_[k].ttft_ms for k in rest])
anyway = [k for k in cov if cached(without[k]) >= cached(with_[k])]
print(json.dumps({
    "retain_orders": len(retains), "expected_s": round(sum(o.spec.expected_benefit_ms for o in retains) / 1e3, 1),
    "requests": len(common), "covered_requests": len(cov),
    "covered_saved_s": round(float(d_cov.sum()) / 1e3, 1),
    "covered_found_cached_anyway": len(anyway),
    "covered_more_cached_with_retain": len(cov) - len(anyway),
    "covered_more_cached_tokens": int(sum(cached(with_[k]) - cached(without[k]) for k in cov)),
    "rest_saved_s": round(float(d_rest.sum()) / 1e3, 1),
    "rest_faster": int((d_rest > 1).sum()), "rest_slower": int((d_rest < -1).sum()),
    "rest_cached_tokens_lost": int(sum(cached(without[k]) - cached(with_[k]) for k in rest)),
}, indent=1))
