"""`predictive` with and without one planner variant (heldout_seeds.py's
names: ext, noprefetch, hN, ...) on a synthetic slice, request by request over
the burst seconds: both burst p99s and the variant's 20 slowest burst
requests beside the same requests without it (where their TTFT went and on
which node). Used for docs/journal/planner.md ("the externality term on
`predictive`"):

    PYTHONHASHSEED=0 PYTHONPATH=build/sim-compiled:.shim python docs/scripts/planner_variant_tail.py document-bursts 17 ext
"""
import math
import sys
from collections import Counter

import numpy as np

import heldout_seeds as H
import speckv.loadgen.sim.simulation as simmod
from synthetic_slice import synthetic_slice
from speckv.loadgen.experiments.metrics import burst_seconds

scenario, seed, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sl = synthetic_slice(scenario, 16, 1800, 600, seed)
bursts = burst_seconds(sl.workload.times.tolist())
runs = {}
for v in ("", variant):
    cfg = H.config_for(v)
    simmod.load_policy_config = lambda *a, **k: cfg
    runs[v] = sl.run("predictive")
a, b = runs[""], runs[variant]
ids = sorted(k for k in set(a) & set(b) if math.floor(b[k].arrival_s) in bursts)
ta = np.array([a[k].ttft_ms for k in ids])
tb = np.array([b[k].ttft_ms for k in ids])
print(len(ids), "burst requests; burst p99 without", np.percentile(ta, 99), "with", variant, np.percentile(tb, 99))


def parts(r):
    return (f"ttft {r.ttft_ms:5.0f} queue {r.queue_ms:5.0f} promote {r.promote_ms:4.0f} pull {r.fetch_ms:4.0f} "
            f"cached {r.cached_tokens:6d} pulled {r.fetched_tokens:6d} prompt {r.prompt_tokens} on {r.node_id}")


top = sorted(ids, key=lambda k: -b[k].ttft_ms)[:20]
print("families of the slowest 20:", Counter(b[k].family for k in top).most_common(5))
print("seconds:", Counter(int(b[k].arrival_s) for k in top).most_common(8))
for k in top:
    print(k, f"{b[k].arrival_s:.2f}", b[k].family, f"\n  {variant}:", parts(b[k]), "\n  off:", parts(a[k]))
