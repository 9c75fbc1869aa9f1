"""What the planner priced for one family, tick by tick, in a simulated
synthetic run of `predictive` at 16 nodes from 1800 s: the family's demand,
holders, expected TTFT with its current options (baseline, ms summed over
the demand), and each candidate's landing time, saving, eviction and link
prices and net (docs/planner.md, "Held-out seeds"):

    .venv/bin/python docs/scripts/planner_price_trace.py document-bursts 13 syn-6 2003 2009 [HORIZON_S]
"""
import math
import sys
from dataclasses import replace

import speckv.loadgen.sim.simulation as simmod
import speckv.services.scheduler.replication.planner as planner_mod
from speckv.loadgen.sim import jobs
from speckv.loadgen.sim.returns import train_returns
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.scaled import SliceView
from speckv.services.scheduler.policy_config import load_policy_config

scenario, seed, family, t0, t1 = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
START_S, DURATION_S, NODES = 1800.0, 600.0, 16
if len(sys.argv) > 6:
    cfg = load_policy_config()
    cfg = replace(cfg, planner=replace(cfg.planner, horizon_s=float(sys.argv[6])))
    simmod.load_policy_config = lambda *a, **k: cfg
add_family = planner_mod._Tick.add_family


def traced_add_family(self, name, demand, kind):
    if name != family or not t0 <= self.now <= t1:
        return add_family(self, name, demand, kind)
    before = len(self.families)
    add_family(self, name, demand, kind)
    if len(self.families) == before:
        print(f"{self.now:.2f} {name}: {demand.count:.1f} requests in {demand.horizon_ms:.0f} ms, not priced "
              "(no holder, or served about as well as a hit on an idle node)")
        return
    fam = self.families[-1]
    print(f"{self.now:.2f} {name}: {demand.count:.1f} requests in {demand.horizon_ms:.0f} ms, holders "
          f"{dict(fam.held)}, baseline {self.baseline[-1]:.0f} ms, hit {fam.hit_ms:.0f} ms, full prefill "
          f"{fam.full_ms:.0f} ms")
    for c in self._candidates(fam, before):
        v = self.value(c)
        print(f"    {c.kind.value} -> {c.node} {c.tier.value}: lands at {c.option.ready_ms:.0f} ms, saving "
              f"{v.saving_ms:.0f}, eviction {v.eviction_ms:.0f}, link {v.link_ms:.0f}, net {v.net_ms:.0f}")


planner_mod._Tick.add_family = traced_add_family
config = jobs.cell_config(None, ())
job = jobs.Job(scenario, seed, NODES, "predictive", START_S, DURATION_S, "builtin", 1.0, None, synthetic=True)
workload, _ = jobs.build_workload(job, config)
base, _ = jobs.build_workload(replace(job, nodes=config.nodes), config)
_, before = base.window(-math.inf, START_S)
returns = train_returns([base[i] for i in range(before)], START_S, "the base workload")
lo, hi = workload.window(START_S, START_S + DURATION_S)
hlo, _ = workload.window(START_S - config.warmup_s, START_S)
settings = SimSettings.from_e2e(config, nodes=NODES)
Simulation(config, settings, "predictive", SliceView(workload, lo, hi), [workload[i] for i in range(hlo, lo)],
           returns=returns, future=workload).run()
