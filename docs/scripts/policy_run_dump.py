"""One policy on a synthetic slice (16 nodes from 1800 s for 600 s, as
heldout_seeds.py), its served records and every order report (time, order,
action, family, source, target, state, blocks), pickled for request-by-request
analysis without rerunning (docs/journal/planner.md, "Dominance on
document-bursts seed 13, traced"):

    PYTHONHASHSEED=0 .venv/bin/python docs/scripts/policy_run_dump.py document-bursts 13 predictive OUT.pkl

POLICY may name a variant of heldout_seeds.py's config_for (e.g. predictive:lead2).
"""
import dataclasses
import pickle
import sys
import time

import speckv.loadgen.sim.scheduler_side as side
import speckv.loadgen.sim.simulation as simmod
from heldout_seeds import config_for
from synthetic_slice import synthetic_slice

scenario, seed, spec, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
policy, _, variant = spec.partition(":")
config = config_for(variant)
simmod.load_policy_config = lambda *a, **k: config
chosen = synthetic_slice(scenario, 16, 1800.0, 600.0, seed)
orders: list = []
original_report = side.report


def logged_report(sim, order, state, message="", nbytes=0, blocks=0):
    spec = order.spec
    orders.append((sim.queue.now(), order.order_id, spec.action.value, spec.family, str(spec.source),
                   str(spec.target), state.value, len(spec.block_hashes), message))
    return original_report(sim, order, state, message, nbytes, blocks)


side.report = logged_report
started = time.time()
records = chosen.run(policy)
with open(out, "wb") as f:
    pickle.dump({"records": {k: dataclasses.asdict(r) for k, r in records.items()}, "orders": orders,
                 "bursts": sorted(__import__("speckv.loadgen.experiments.metrics", fromlist=["x"]).burst_seconds(
                     chosen.workload.times.tolist()))}, f)
print(policy, len(records), len(orders), round(time.time() - started, 1), "s")
