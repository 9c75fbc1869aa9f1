"""Two policies on the same synthetic slice, request by request, over the
burst seconds: the burst p99 of each, a paired bootstrap interval of their
difference (the same requests drawn for both), the quantiles side by side,
how many requests got faster or slower, and the slowest requests of the
second policy with where their TTFT went (queue, promotion, pull, prefill)
beside the first policy's figures for the same request. Used for
docs/planner.md ("agent-fanout's burst p99, traced"):

    .venv/bin/python docs/scripts/burst_tail_pair.py agent-fanout 16 1800 600 7 none predictive
"""
import math
import sys

import numpy as np
from synthetic_slice import synthetic_slice

from speckv.loadgen.experiments.bootstrap import bootstrap_draws, paired_intervals
from speckv.loadgen.experiments.metrics import burst_seconds

scenario, nodes, start, duration, seed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), \
    int(sys.argv[5])
first, second = sys.argv[6], sys.argv[7]
chosen = synthetic_slice(scenario, nodes, start, duration, seed)
bursts = burst_seconds(chosen.workload.times.tolist())


def parts(r):
    prefill = r.ttft_ms - r.queue_ms - r.promote_ms - r.fetch_ms
    return (f"ttft {r.ttft_ms:5.0f} queue {r.queue_ms:4.0f} promote {r.promote_ms:3.0f} pull {r.fetch_ms:4.0f} "
            f"prefill {prefill:4.0f} cached {r.cached_tokens:6d} pulled {r.fetched_tokens:5d} on {r.node_id}")


a, b = chosen.run(first), chosen.run(second)
ids = sorted(k for k in set(a) & set(b) if math.floor(b[k].arrival_s) in bursts)
ta, tb = np.array([a[k].ttft_ms for k in ids]), np.array([b[k].ttft_ms for k in ids])
target_ms = chosen.config.ttft_target_ms
paired = paired_intervals(bootstrap_draws(list(b.values()), bursts, target_ms),
                          bootstrap_draws(list(a.values()), bursts, target_ms)).get("burst_ttft_p99_ms")
interval = "not paired (the two runs served different requests)" if paired is None else \
    f"paired bootstrap 95 % [{paired[0]:+.0f}, {paired[1]:+.0f}]"
print(f"{len(ids)} burst requests; burst p99 {first} {np.percentile(ta, 99):.0f}, {second} "
      f"{np.percentile(tb, 99):.0f} ms; {second} - {first}: {np.percentile(tb, 99) - np.percentile(ta, 99):+.0f} ms, "
      f"{interval}")
for q in (50, 90, 95, 98, 99, 99.5):
    print(f"  p{q}: {np.percentile(ta, q):.0f} / {np.percentile(tb, q):.0f}")
delta = tb - ta
print(f"slower by > 50 ms: {(delta > 50).sum()}, faster by > 50 ms: {(delta < -50).sum()}, mean TTFT "
      f"{ta.mean():.0f} / {tb.mean():.0f}, served on the same node: {sum(a[k].node_id == b[k].node_id for k in ids)}")
for k in sorted(ids, key=lambda k: -b[k].ttft_ms)[:int(sys.argv[8]) if len(sys.argv) > 8 else 18]:
    print(f"{k} {b[k].arrival_s:.2f} {b[k].family}\n  {second}: {parts(b[k])}\n  {first}: {parts(a[k])}")
