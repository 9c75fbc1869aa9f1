"""The returning requests at or above the p99 of a simulated slice, per policy:
where their TTFT goes (queue wait, prefill, promotion and pull waits), their
prompt length and the share of it that was cached. Used for docs/planner.md:

    .venv/bin/python docs/scripts/returning_tail.py ../shared/traces/mooncake_conversation_trace.jsonl 2476 8 none,oracle

"Returning" here: the request's family (conversation) was seen earlier in the
trace; the comparison tables use the stricter floor-based definition."""
import sys, math, json

import numpy as np
from speckv.loadgen.sim import jobs as J
from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.scaled import SliceView
from speckv.loadgen.sim.returns import train_returns
trace, start, nodes = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]); policies = sys.argv[4].split(",")
config = load_e2e_config(None)
out = {}
for policy in policies:
    job = J.Job(trace, 7, nodes, policy, start, None, "builtin", 1.0, None)
    workload, notes = J.build_workload(job, config)
    base, _ = J.build_workload(J.replace(job, nodes=config.nodes), config)
    _, before = base.window(-math.inf, start)
    ret = train_returns([base[i] for i in range(before)], start)
    lo, hi = workload.window(start, math.inf)
    hlo, _ = workload.window(start - config.warmup_s, start)
    history = [workload[i] for i in range(hlo, lo)]
    seen = set(r.family for r in (workload[i] for i in range(0, lo)))
    settings = SimSettings.from_e2e(config, nodes=nodes)
    run = Simulation(config, settings, policy, SliceView(workload, lo, hi), history, returns=ret, future=workload).run()
    rows = []
    for r in run.records:
        if not r.served: continue
        returning = r.family in seen
        seen.add(r.family)
        if not returning: continue
        prof = config.profile
        skipped = r.cached_tokens + r.fetched_tokens
        prefill = prof.prefill_ms(r.prompt_tokens - skipped, skipped)
        rows.append((r.ttft_ms, r.queue_ms, prefill, r.promote_ms or 0.0, r.fetch_ms or 0.0, r.prompt_tokens, skipped / r.prompt_tokens, r.node_id))
    a = np.array([x[:7] for x in rows])
    p99 = np.percentile(a[:, 0], 99)
    top = a[a[:, 0] >= p99]
    nodes_top = {}
    for x in rows:
        if x[0] >= p99: nodes_top[x[7]] = nodes_top.get(x[7], 0) + 1
    out[policy] = {"returning": len(a), "p99": round(p99), "top_n": len(top), "ttft": round(top[:, 0].mean()),
                   "queue": round(top[:, 1].mean()), "prefill": round(top[:, 2].mean()), "promote": round(top[:, 3].mean(), 1),
                   "fetch": round(top[:, 4].mean(), 1), "prompt": round(top[:, 5].mean()), "cached_share": round(top[:, 6].mean(), 3),
                   "nodes_in_top": sorted(nodes_top.values(), reverse=True)[:5], "all_queue_mean": round(a[:, 1].mean()),
                   "top_queue_ge_2s": int((top[:, 1] >= 2000).sum())}
    print(policy, json.dumps(out[policy]), flush=True)
