"""When could a cascade's parent announce its sub-calls? agent-cascades'
generator (loadgen/workload/synthetic.py, `hawkes`) places each child
Exp(mean 1 / decay) after its parent's *arrival*, so from the parent's
served records: P(the child arrives before the parent's first token) is the
mean over calls of 1 - exp(-decay x TTFT), and before its end (its turn end,
when an agent framework knows the call's tool calls) 1 - exp(-decay x e2e).
Used for docs/planner.md ("A first-surge signal for agent-cascades"):

    .venv/bin/python docs/scripts/announce_timing.py agent-cascades 11 none
"""
import json
import sys

import numpy as np
from synthetic_slice import synthetic_slice

scenario, seed, policy = sys.argv[1], int(sys.argv[2]), sys.argv[3]
decay = float(json.load(open("services/config/scenarios.json"))["scenarios"][scenario]["params"]["decay"])
records = list(synthetic_slice(scenario, 16, 1800, 600, seed).run(policy).values())
ttft_s = np.array([r.ttft_ms for r in records]) / 1e3
e2e_s = np.array([r.e2e_ms for r in records]) / 1e3
print(f"{scenario} seed {seed} {policy}: {len(records)} calls; TTFT median {np.median(ttft_s):.3f} s; "
      f"e2e median {np.median(e2e_s):.2f} s, 10 % {np.quantile(e2e_s, 0.1):.2f} s")
print(f"P(a child arrives before its parent's first token) {np.mean(1 - np.exp(-decay * ttft_s)):.3f}")
print(f"P(a child arrives before its parent's end)         {np.mean(1 - np.exp(-decay * e2e_s)):.3f}")
