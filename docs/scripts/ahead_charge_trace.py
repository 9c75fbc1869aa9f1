"""The router's prefill-ahead charge, request by request (issue 45): one
policy on a synthetic slice with the charge off and with weight W, the burst
requests side by side. In the run with the charge every route is decided
twice from the same RNG state (once with w = 0, the choice it would have
made, then with W, the choice it makes), so each request is known as
*moved* (the charge changed its node) or not; for a moved one it prints
the charge on the node it left, its uncharged figures there (queue, the
promotion or pull before its prefill, prefill) and on the node it went to,
and how many of the routed requests there were still fetching. The slowest
burst requests of the run with the charge are then classed: moved (the
charge sent it elsewhere), or not moved (it queued behind what the charge
moved, or behind its own node's changed queue). Used for docs/planner.md
("The router's prefill-ahead charge"):

    PYTHONHASHSEED=0 PYTHONPATH=.shim python docs/scripts/ahead_charge_trace.py document-bursts 19 none 1

On the source build only (it wraps the route call). The warm start's routes
are decided twice as well and counted apart (their requests have no record).
"""
import dataclasses
import math
import sys

import numpy as np
from synthetic_slice import synthetic_slice

import speckv.loadgen.sim.simulation as simmod
from speckv.loadgen.experiments.bootstrap import bootstrap_draws, paired_intervals
from speckv.loadgen.experiments.metrics import burst_seconds
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.routing.router import best_holder

scenario, seed, policy, weight = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
chosen = synthetic_slice(scenario, 16, 1800.0, 600.0, seed)
bursts = burst_seconds(chosen.workload.times.tolist())
BASE = load_policy_config()


def with_weight(w: float):
    router = dataclasses.replace(BASE.router, prefill_ahead_weight=w)
    return dataclasses.replace(BASE, router=router)


def run(w: float, watch: dict | None):
    simmod.load_policy_config = lambda *a, **k: with_weight(w)
    original = simmod.Simulation._warm_start

    def warm_start(self, history):  # wrapped before the warm start routes the history, which the charge sees too
        if watch is not None:
            wrap(self.core._router, watch)
        return original(self, history)
    simmod.Simulation._warm_start = warm_start
    try:
        sim = chosen.simulation(policy)
    finally:
        simmod.Simulation._warm_start = original
    return {r.request_id: r for r in sim.run().records if r.served}


def wrap(router, watch):
    original = router.choose

    def choose(query, candidates):
        state, weight_now = router._rng.getstate(), router._ahead_weight
        router._ahead_weight = 0.0
        plain = original(query, candidates)
        router._ahead_weight = weight_now
        router._rng.setstate(state)
        charged = original(query, candidates)
        if plain.node_id != charged.node_id:
            by_id = {c.node_id: c for c in candidates}
            holder = best_holder(candidates)
            left = by_id[plain.node_id]
            pulls = holder is not None and holder.node_id != left.node_id and holder.cached_blocks > left.cached_blocks
            figures = router._figures(query, left, holder if pulls else None)
            charge = router._ahead_charge(query, left, figures, holder.cached_blocks if holder else 0)
            watch[query.request_id] = dict(
                left=plain, went=charged, charge=charge, entering_left=left.entering_ms,
                entering_went=by_id[charged.node_id].entering_ms, prompt=query.prompt_tokens)
        return charged
    router.choose = choose


def parts(r):
    prefill = r.ttft_ms - r.queue_ms - r.promote_ms - r.fetch_ms
    return (f"ttft {r.ttft_ms:5.0f} queue {r.queue_ms:4.0f} promote {r.promote_ms:3.0f} pull {r.fetch_ms:4.0f} "
            f"prefill {prefill:4.0f} cached {r.cached_tokens:6d} pulled {r.fetched_tokens:5d} on {r.node_id}")


def decision(d):
    return (f"{d.node_id} exp {d.expected_ttft_ms:5.0f} (queue {d.queue_ms:4.0f} before "
            f"{d.fetch_ms + d.promote_ms:4.0f} prefill {d.prefill_ms:4.0f}) cached {d.cached_blocks} "
            f"pull {d.fetch_blocks}")


watch: dict = {}
a, b = run(0.0, None), run(weight, watch)
ids = sorted(k for k in set(a) & set(b) if math.floor(b[k].arrival_s) in bursts)
ta, tb = np.array([a[k].ttft_ms for k in ids]), np.array([b[k].ttft_ms for k in ids])
target_ms = chosen.config.ttft_target_ms
paired = paired_intervals(bootstrap_draws(list(b.values()), bursts, target_ms),
                          bootstrap_draws(list(a.values()), bursts, target_ms)).get("burst_ttft_p99_ms")
print(f"{scenario} {seed} {policy}: {len(ids)} burst requests; burst p99 w=0 {np.percentile(ta, 99):.0f}, "
      f"w={weight:g} {np.percentile(tb, 99):.0f} ms, paired 95 % {paired}")
for q in (50, 90, 95, 99):
    print(f"  p{q}: {np.percentile(ta, q):.0f} / {np.percentile(tb, q):.0f}")
moved_all = set(watch)
moved_burst = [k for k in ids if k in moved_all]
warm = [k for k in watch if k.startswith("warm-")]
print(f"warm-start routes moved by the charge: {len(warm)} of {len(chosen.history)}")
print(f"routes moved by the charge: {len(moved_all) - len(warm)} of {len(b)}, {len(moved_burst)} of the burst requests; "
      f"burst requests served on another node than at w=0: {sum(a[k].node_id != b[k].node_id for k in ids)}")
dm = np.array([b[k].ttft_ms - a[k].ttft_ms for k in moved_burst]) if moved_burst else np.zeros(1)
print(f"moved burst requests: TTFT change mean {dm.mean():+.0f} ms, median {np.median(dm):+.0f}, "
      f"slower > 50 ms {(dm > 50).sum()}, faster > 50 ms {(dm < -50).sum()}")
tail = [k for k in sorted(ids, key=lambda k: -b[k].ttft_ms) if b[k].ttft_ms >= np.percentile(tb, 98)]
print(f"tail (>= p98 of w={weight:g}): {len(tail)} requests, moved {sum(k in moved_all for k in tail)}")
for k in tail[:30]:
    tag = "MOVED" if k in moved_all else "not moved"
    print(f"{k} {b[k].arrival_s:.2f} {b[k].family} prompt {b[k].prompt_tokens} [{tag}] "
          f"delta {b[k].ttft_ms - a[k].ttft_ms:+.0f}\n  w={weight:g}: {parts(b[k])}\n  w=0: {parts(a[k])}")
    if k in watch:
        w = watch[k]
        print(f"  left {decision(w['left'])} charge {w['charge']:.0f} entering there "
              f"{[round(x) for x in w['entering_left']]}\n  went {decision(w['went'])}")
print("every moved route (history routes have no record):")
for k, w in sorted(((k, w) for k, w in watch.items() if not k.startswith("warm-")), key=lambda kw: int(kw[0][1:])):
    line = f"{k} prompt {w['prompt']} charge {w['charge']:.0f}\n  left {decision(w['left'])} entering there " \
           f"{[round(x) for x in w['entering_left']]}\n  went {decision(w['went'])}"
    if k in b and k in a:
        line += f"\n  served w={weight:g}: {parts(b[k])}\n  served w=0: {parts(a[k])} at {b[k].arrival_s:.2f}"
    print(line)
# The moved requests that preceded the tail on the tail's nodes, shortly before: who they queued behind.
for k in tail[:12]:
    if k in moved_all:
        continue
    r = b[k]
    before = [m for m in moved_all if m in b and b[m].node_id == r.node_id and 0 <= r.arrival_s - b[m].arrival_s < 3]
    print(f"{k} on {r.node_id} at {r.arrival_s:.2f}: moved here within 3 s before it: "
          + ", ".join(f"{m} ({b[m].arrival_s:.2f}, prompt {b[m].prompt_tokens}, cached {b[m].cached_tokens}, "
                      f"prefill {b[m].ttft_ms - b[m].queue_ms - b[m].promote_ms - b[m].fetch_ms:.0f})"
                      for m in sorted(before, key=lambda m: b[m].arrival_s)))
# Where the two runs part: the first served request (in arrival order) on another node, and the share after it.
order = sorted(set(a) & set(b), key=lambda k: a[k].arrival_s)
first = next((k for k in order if a[k].node_id != b[k].node_id), None)
if first is not None:
    after = [k for k in order if a[k].arrival_s >= a[first].arrival_s]
    print(f"first request on another node: {first} at {a[first].arrival_s:.2f} s; of the {len(after)} from there, "
          f"{sum(a[k].node_id != b[k].node_id for k in after)} on another node")
