"""An experiment, not a policy: how much could retention (issue 21's unbuilt
third action) move the returning tail if it knew the future?

Runs `none` on a slice with every node's tiers taught one extra rule: when a
request's blocks are stored, they are retained (passed over by eviction,
both tiers) until its conversation's next arrival, if that comes within
HORIZON_S; eviction passes over at most MAX_PASSES retained blocks before it
takes one anyway, so a tier full of retained blocks still makes room. The
oracle's knowledge (the true next arrival) makes this an upper bound for a
forecast-driven retain. Prints, per run, the returning requests' p99 and the
top 1 %'s queue, prefill and cached share (as returning_tail.py does):

    .venv/bin/python docs/scripts/oracle_retention.py ../shared/traces/mooncake_conversation_trace.jsonl 2476 8 600
"""
import bisect
import json
import math
import sys
from collections import defaultdict

import numpy as np

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.sim import jobs as J
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.scaled import SliceView
from speckv.services.kvstore.eviction import LapsedThenLRU

MAX_PASSES = 64
trace, start, nodes, HORIZON_S = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
config = load_e2e_config(None)
retained: dict[int, float] = {}


def _skip_retained(choose):
    def victim(self, now, *args):
        for _ in range(MAX_PASSES):
            h = choose(self, now, *args)
            if h is None or retained.get(h, -1.0) <= now:
                return h
            self._lru.move_to_end(h)  # most recently used: eviction passes over it
        return choose(self, now, *args)
    return victim


def run(retain: bool) -> dict:
    job = J.Job(trace, 7, nodes, "none", start, None, "builtin", 1.0, None)
    workload, _ = J.build_workload(job, config)
    lo, hi = workload.window(start, math.inf)
    hlo, _ = workload.window(start - config.warmup_s, start)
    arrivals = defaultdict(list)
    for i in range(lo, hi):
        arrivals[workload[i].family].append(workload[i].arrival_s)
    retained.clear()
    sim = Simulation(config, SimSettings.from_e2e(config, nodes=nodes), "none", SliceView(workload, lo, hi),
                     [workload[i] for i in range(hlo, lo)], future=workload)
    if retain:
        store = sim._store

        def store_and_retain(node, flight):
            store(node, flight)
            r, now = flight.request, sim.queue.now()
            times = arrivals[r.family]
            j = bisect.bisect_right(times, r.arrival_s)
            if j < len(times) and times[j] - now <= HORIZON_S:
                for h in r.block_hashes[:r.full_blocks]:
                    retained[h] = max(retained.get(h, 0.0), times[j] + 1.0)
        sim._store = store_and_retain
    records = sim.run().records
    seen = {workload[i].family for i in range(lo)}
    rows = []
    for r in records:
        if not r.served:
            continue
        returning = r.family in seen
        seen.add(r.family)
        if returning:
            skipped = r.cached_tokens + r.fetched_tokens
            rows.append((r.ttft_ms, r.queue_ms, config.profile.prefill_ms(r.prompt_tokens - skipped, skipped),
                         skipped / r.prompt_tokens))
    a = np.array(rows)
    p99 = np.percentile(a[:, 0], 99)
    top = a[a[:, 0] >= p99]
    return {"retain": retain, "returning": len(a), "p99": round(p99), "p50": round(float(np.percentile(a[:, 0], 50))),
            "top_queue": round(top[:, 1].mean()), "top_prefill": round(top[:, 2].mean()),
            "top_cached_share": round(top[:, 3].mean(), 3), "cached_share_all": round(a[:, 3].mean(), 3)}


if __name__ == "__main__":
    print(json.dumps(run(False)), flush=True)
    LapsedThenLRU.victim = _skip_retained(LapsedThenLRU.victim)
    print(json.dumps(run(True)), flush=True)
