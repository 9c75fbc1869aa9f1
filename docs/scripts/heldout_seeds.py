"""Held-out realizations of a synthetic scenario (seeds other than the
evaluation's 7), 16 nodes, [1800, 2400) s: `none`, `reactive-heat`, `oracle`
and `predictive` under planner variants, one line of JSON per simulation.
Used for docs/planner.md ("Held-out seeds"); no benchmark reports on these
seeds, so choices may be made on them.

    .venv/bin/python docs/scripts/heldout_seeds.py OUT.jsonl document-bursts 11,13,17,19 \
        none,reactive-heat,oracle,predictive,predictive:now0,predictive:noprefetch,predictive:h15
    .venv/bin/python docs/scripts/heldout_seeds.py --table OUT.jsonl burst_ttft_p99_ms

Variants of predictive (the committed policies.json, changed in one place):
noprefetch (planner.prefetch false), ext (planner.queue_externality true),
hN (planner.horizon_s N), nowK (planner.nowcast_min_routes K; now0: no
nowcast), lgbm (the LightGBM predictor instead of the builtin).
Runs two simulations at a time in forked workers (the variant is patched
into the worker's configuration before it starts)."""
import collections
import dataclasses
import json
import math
import multiprocessing as mp
import sys
import time
from dataclasses import replace

import speckv.loadgen.sim.simulation as simmod
from speckv.loadgen.sim import jobs
from speckv.loadgen.sim.returns import train_returns
from speckv.services.scheduler.policy_config import load_policy_config

START_S, DURATION_S, NODES = 1800.0, 600.0, 16


def config_for(variant: str):
    base = load_policy_config()
    p = base.planner
    for part in (v for v in variant.split("+") if v):
        if part == "noprefetch":
            p = replace(p, prefetch=False)
        elif part == "ext":
            p = replace(p, queue_externality=True)
        elif part.startswith("h"):
            p = replace(p, horizon_s=float(part[1:]))
        elif part.startswith("now"):
            p = replace(p, nowcast_min_routes=int(part[3:]))
        elif part not in ("lgbm", "base"):
            raise ValueError(f"unknown variant {part!r}")
    return replace(base, planner=p)


def run(task):
    scenario, seed, spec = task
    policy, _, variant = spec.partition(":")
    cfg = config_for(variant)
    simmod.load_policy_config = lambda *a, **k: cfg
    job = jobs.Job(source=scenario, seed=seed, nodes=NODES, policy=policy, start_s=START_S, duration_s=DURATION_S,
                   predictor="lightgbm" if "lgbm" in variant else "builtin", speed=1.0, config_path=None,
                   synthetic=True)
    if policy == "predictive":
        config = jobs.cell_config(None, ())
        base, _ = jobs.build_workload(replace(job, nodes=config.nodes), config)
        _, before = base.window(-math.inf, START_S)
        job = replace(job, returns=train_returns([base[i] for i in range(before)], START_S, "the base workload"))
    started = time.time()
    summary = dataclasses.asdict(jobs.run_job(job).summary)
    figures = {k: v for k, v in summary.items() if isinstance(v, (int, float, type(None)))}
    actions = {k: v.get("orders") for k, v in (summary.get("actions") or {}).items()}
    return dict(scenario=scenario, seed=seed, policy=spec, wall_s=round(time.time() - started, 1),
                actions=actions, **figures)


def table(path: str, key: str) -> None:
    by: dict = collections.defaultdict(dict)
    for line in open(path):
        row = json.loads(line)
        by[(row["scenario"], row["seed"])][row["policy"]] = row[key]
    cols = sorted({c for d in by.values() for c in d})
    print(f"| scenario | seed | {' | '.join(cols)} |")
    print("|---|---:|" + "---:|" * len(cols))
    for (scenario, seed), d in sorted(by.items()):
        print(f"| {scenario} | {seed} | " + " | ".join(f"{d[c]:.0f}" if d.get(c) is not None else "-" for c in cols)
              + " |")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2], sys.argv[3])
        sys.exit(0)
    out, scenarios, seeds, specs = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), sys.argv[4].split(",")
    tasks = [(sc, int(sd), spec) for sc in scenarios for sd in seeds for spec in specs]
    with mp.get_context("fork").Pool(2) as pool, open(out, "a") as f:
        for row in pool.imap_unordered(run, tasks):
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(row["scenario"], row["seed"], row["policy"], row["wall_s"], flush=True)
