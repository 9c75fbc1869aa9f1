"""Held-out realizations of a synthetic scenario (seeds other than the
evaluation's 7), 16 nodes, [1800, 2400) s: `none`, `reactive-heat`, `oracle`
and `predictive` under planner variants, one line of JSON per simulation.
Used for docs/planner.md ("Held-out seeds"); no benchmark reports on these
seeds, so choices may be made on them.

    .venv/bin/python docs/scripts/heldout_seeds.py OUT.jsonl document-bursts 11,13,17,19 \
        none,reactive-heat,oracle,predictive,predictive:now0,predictive:noprefetch,predictive:h15
    .venv/bin/python docs/scripts/heldout_seeds.py --table OUT.jsonl burst_ttft_p99_ms
    .venv/bin/python docs/scripts/heldout_seeds.py --paired OUT.jsonl burst_ttft_p99_ms predictive

A trace path in place of the scenario runs that trace's slice instead (seed
0; SLICE=START,DURATION,NODES in the environment, default 1200,1276,8: the
conversation trace's validation slice, before the evaluated last 30 %):

    SLICE=1200,1276,8 .venv/bin/python docs/scripts/heldout_seeds.py OUT.jsonl \
        ../shared/traces/mooncake_conversation_trace.jsonl 0 none,predictive,predictive:occ

Variants of predictive (the committed policies.json, changed in one place):
noprefetch (planner.prefetch false), ext (planner.queue_externality true), aheadW (the router's
prefill-ahead charge, router.prefill_ahead_weight W; "ahead" alone: 1),
hN (planner.horizon_s N), nowK (planner.nowcast_min_routes K; now0: no
nowcast), lgbm (the LightGBM predictor instead of the builtin), occ
(retain.displacement "occupancy"), curve (retain.pricing "curve"), ttlN (retain.ttl_s N), capN (the e2e configuration's
cluster.retain_max_share N / 100), nosig (agent-fanout without announced
follow-ups: every request's follow_ups 0, in training and serving), surgeF
(planner.surge_replan_factor F), leadL (planner.nowcast_lead_s L), priceP (planner.copy_ms_per_gib P), insL (planner.insurance_life_s L), norr
(session-return forecasts buy no copies, only prefetches and retains), norp (they buy no prefetches), recal
(the session-return model serves with its level recalibration on: predictor.json's
session_return.recalibration, enabled), spillS (affinity.spill S: router or least_loaded), rseedK (the
router's tie-break seed K instead of 0: a placebo, no policy's change); norr
and norp are patched into the planner, so they run on the source, not the compiled build; joined with "+".
Runs two simulations at a time (WORKERS in the environment: that many) in forked workers (the variant is patched
into the worker's configuration before it starts)."""
import collections
import dataclasses
import functools
import json
import math
import multiprocessing as mp
import os
import sys
import time
from dataclasses import replace

import numpy as np

import speckv.loadgen.sim.simulation as simmod
import speckv.loadgen.workload.fanout as fanout_module
from speckv.loadgen.experiments.bootstrap import BootstrapDraws, paired_intervals
from speckv.loadgen.sim import jobs
from speckv.loadgen.sim.returns import train_returns
from speckv.services.scheduler.forecasts import ForecastKind
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.ports import SchedulerSettings
from speckv.services.scheduler.replication import planner as planner_module
from speckv.services.scheduler.orders import ActionKind

START_S, DURATION_S, NODES = 1800.0, 600.0, 16
ORIGINAL_CANDIDATES = planner_module._Tick._candidates


def config_for(variant: str):
    base = load_policy_config()
    p, r, a, router = base.planner, base.retain, base.affinity, base.router
    for part in (v for v in variant.split("+") if v):
        if part.startswith("spill"):
            a = replace(a, spill=part[5:])
        elif part.startswith("ahead"):
            router = replace(router, prefill_ahead_weight=float(part[5:] or 1.0))
        elif part == "noprefetch":
            p = replace(p, prefetch=False)
        elif part == "ext":
            p = replace(p, queue_externality=True)
        elif part.startswith("ins"):
            p = replace(p, insurance_life_s=float(part[3:]))
        elif part.startswith("price"):
            p = replace(p, copy_ms_per_gib=float(part[5:]))
        elif part.startswith("lead"):
            p = replace(p, nowcast_lead_s=float(part[4:]))
        elif part.startswith("surge"):
            p = replace(p, surge_replan_factor=float(part[5:]))
        elif part == "occ":
            r = replace(r, displacement="occupancy")
        elif part == "curve":
            r = replace(r, pricing="curve")
        elif part.startswith("ttl"):
            r = replace(r, ttl_s=float(part[3:]))
        elif part.startswith("h"):
            p = replace(p, horizon_s=float(part[1:]))
        elif part.startswith("now"):
            p = replace(p, nowcast_min_routes=int(part[3:]))
        elif part.startswith(("cap", "rseed")) or part in ("lgbm", "base", "nosig", "norr", "norp", "recal"):
            pass  # capN changes the e2e configuration (e2e_config_for), rseedK the scheduler settings (run)
        else:
            raise ValueError(f"unknown variant {part!r}")
    return replace(base, planner=p, retain=r, affinity=a, router=router)


def e2e_config_for(variant: str) -> str | None:
    """A copy of the committed e2e configuration with capN applied (its path), or None."""
    caps = [part for part in variant.split("+") if part.startswith("cap")]
    if not caps:
        return None
    raw = json.loads(open("services/config/e2e.json").read())
    raw["cluster"]["retain_max_share"] = int(caps[-1][3:]) / 100
    path = f"/tmp/heldout-e2e-{caps[-1]}.json"
    with open(path, "w") as f:
        json.dump(raw, f)
    return path


def _without(kinds):
    """_Tick._candidates without the candidates of `kinds` for families whose demand is a return forecast."""
    def candidates(tick, fam, index):
        out = ORIGINAL_CANDIDATES(tick, fam, index)
        if tick.forecast.get(fam.family) is ForecastKind.RETURN:
            return [c for c in out if c.kind not in kinds]
        return out
    return candidates


PATCHES = {"norr": _without({ActionKind.REPLICATE, ActionKind.REDUNDANT}), "norp": _without({ActionKind.PREFETCH})}
ORIGINAL_RETURN_CONFIG = train_returns.__globals__["load_return_config"]


def _with_recalibration():
    """The committed session-return configuration with its level recalibration on."""
    config = ORIGINAL_RETURN_CONFIG()
    return replace(config, recalibration=replace(config.recalibration, enabled=True))


def use_recalibration(on: bool) -> None:
    """recal: the return model is trained (and so serves) with the configured recalibration on."""
    train_returns.__globals__["load_return_config"] = _with_recalibration if on else ORIGINAL_RETURN_CONFIG


def run(task):
    scenario, seed, spec = task
    policy, _, variant = spec.partition(":")
    cfg = config_for(variant)
    patches = [PATCHES[part] for part in variant.split("+") if part in PATCHES]
    if len(patches) > 1:
        raise ValueError(f"{variant}: one of {sorted(PATCHES)} at a time")
    wanted = patches[0] if patches else ORIGINAL_CANDIDATES
    if planner_module._Tick._candidates is not wanted:
        planner_module._Tick._candidates = wanted  # TypeError on the compiled build: run norr on the source
    simmod.load_policy_config = lambda *a, **k: cfg
    # rseedK: the router's tie-break RNG seeded K (a placebo: a change that is no policy's, to see how far one
    # different route early on moves a slice's figures; a worker runs several tasks: reset it every time)
    seeds = [int(part[5:]) for part in variant.split("+") if part.startswith("rseed")]
    simmod.SchedulerSettings = functools.partial(SchedulerSettings, router_seed=seeds[-1]) if seeds \
        else SchedulerSettings
    recal = "recal" in variant.split("+")
    use_recalibration(recal)
    # nosig: the generator's follow_ups are never set (a worker runs several tasks: reset it every time)
    fanout_module.replace = (lambda request, **changes: request) if "nosig" in variant.split("+") else replace
    synthetic = not scenario.endswith(".jsonl")
    start_s, duration_s, nodes = (START_S, DURATION_S, NODES) if synthetic else trace_slice()
    job = jobs.Job(source=scenario, seed=seed, nodes=nodes, policy=policy, start_s=start_s, duration_s=duration_s,
                   predictor="lightgbm" if "lgbm" in variant else "builtin", speed=1.0,
                   config_path=e2e_config_for(variant), synthetic=synthetic)
    if policy == "predictive" and not synthetic:
        job = replace(job, returns=trace_returns(scenario, start_s, recal))
    elif policy == "predictive":
        config = jobs.cell_config(None, ())
        base, _ = jobs.build_workload(replace(job, nodes=config.nodes), config)
        _, before = base.window(-math.inf, START_S)
        job = replace(job, returns=train_returns([base[i] for i in range(before)], START_S, "the base workload"))
    started = time.time()
    result = jobs.run_job(job)
    summary = dataclasses.asdict(result.summary)
    figures = {k: v for k, v in summary.items() if isinstance(v, (int, float, type(None)))}
    actions = {k: {**_action_figures(v), "by_forecast": {f: _action_figures(part) for f, part in
                                                         (v.get("by_forecast") or {}).items()}}
               for k, v in (summary.get("actions") or {}).items()}
    draws = {"key": result.draws.key, **{k: v.tolist() for k, v in result.draws.values.items()}}
    return dict(scenario=scenario, seed=seed, policy=spec, wall_s=round(time.time() - started, 1),
                actions=actions, draws=draws, **figures)


def _action_figures(stats: dict) -> dict:
    return {f: stats.get(f) for f in ("orders", "bytes", "bytes_used_in_time_share", "bytes_read_after_lease")}


def trace_slice() -> tuple[float, float, int]:
    start, duration, nodes = os.environ.get("SLICE", "1200,1276,8").split(",")
    return float(start), float(duration), int(nodes)


@functools.lru_cache(maxsize=2)
def trace_returns(path: str, start_s: float, recal: bool = False):
    """The return model on the trace before the slice, as `speckv simulate`
    trains it; once per worker process, not once per task."""
    config = jobs.cell_config(None, ())
    base, _ = jobs.build_workload(jobs.Job(source=path, seed=0, nodes=config.nodes, policy="none", start_s=start_s,
                                           duration_s=None, predictor="builtin", speed=1.0, config_path=None,
                                           synthetic=False), config)
    _, before = base.window(-math.inf, start_s)
    return train_returns([base[i] for i in range(before)], start_s, "the base trace")


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


def paired(path: str, key: str, baseline: str) -> None:
    """Each policy's figure minus the baseline's with the 95 % paired
    bootstrap interval of that difference (bootstrap.paired_intervals: the
    same requests in every draw), per scenario and seed."""
    by: dict = collections.defaultdict(dict)
    for line in open(path):
        row = json.loads(line)
        draws = row.get("draws")
        if draws is not None:
            values = {k: np.array([math.nan if x is None else x for x in v]) for k, v in draws.items() if k != "key"}
            by[(row["scenario"], row["seed"])][row["policy"]] = (row[key], BootstrapDraws(draws["key"], values))
    for (scenario, seed), runs in sorted(by.items()):
        if baseline not in runs:
            continue
        base_value, base_draws = runs[baseline]
        for policy, (value, draws) in sorted(runs.items()):
            interval = paired_intervals(draws, base_draws).get(key)
            if policy != baseline and interval is not None:
                print(f"{scenario} {seed} {policy} - {baseline}: {value - base_value:+.0f} "
                      f"[{interval[0]:+.0f}, {interval[1]:+.0f}]")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2], sys.argv[3])
        sys.exit(0)
    if sys.argv[1] == "--paired":
        paired(sys.argv[2], sys.argv[3], sys.argv[4])
        sys.exit(0)
    out, scenarios, seeds, specs = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), sys.argv[4].split(",")
    tasks = [(sc, int(sd), spec) for sc in scenarios for sd in seeds for spec in specs]
    with mp.get_context("fork").Pool(int(os.environ.get("WORKERS", "2"))) as pool, open(out, "a") as f:
        for row in pool.imap_unordered(run, tasks):
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(row["scenario"], row["seed"], row["policy"], row["wall_s"], flush=True)
