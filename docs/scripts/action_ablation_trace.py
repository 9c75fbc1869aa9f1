"""An analysis, not a policy: where does an action's measured saving (or
cost) come from, request by request? Runs POLICY and POLICY-without-ACTION
(loadgen/sim/ablation.py) on a slice and splits the difference in TTFT of
every request into its parts (queue wait, promotion, pull, prefill), and
counts the requests that got faster and slower:

    .venv/bin/python docs/scripts/action_ablation_trace.py document-bursts 16 1800 600 predictive prefetch
"""
import json
import sys

import numpy as np
from synthetic_slice import synthetic_slice

scenario, nodes, start, duration, policy, action = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), \
    float(sys.argv[4]), sys.argv[5], sys.argv[6]
chosen = synthetic_slice(scenario, nodes, start, duration)


def parts(r):
    prefill = r.ttft_ms - r.queue_ms - r.promote_ms - r.fetch_ms
    return np.array([r.ttft_ms, r.queue_ms, r.promote_ms, r.fetch_ms, prefill])


with_, without = chosen.run(policy), chosen.run(f"{policy}-without-{action}")
common = sorted(set(with_) & set(without))
delta = np.array([parts(without[k]) - parts(with_[k]) for k in common])  # > 0: the action saved it
names = ["ttft", "queue", "promote", "pull", "prefill"]
print(json.dumps({
    "requests": len(common),
    "saved_ms_total": {n: round(float(delta[:, i].sum())) for i, n in enumerate(names)},
    "faster": int((delta[:, 0] > 1).sum()), "slower": int((delta[:, 0] < -1).sum()),
    "slower_ms_total": round(float(delta[delta[:, 0] < -1, 0].sum())),
    "faster_ms_total": round(float(delta[delta[:, 0] > 1, 0].sum())),
    "p99_with": round(float(np.percentile([with_[k].ttft_ms for k in common], 99))),
    "p99_without": round(float(np.percentile([without[k].ttft_ms for k in common], 99))),
}, indent=1))
