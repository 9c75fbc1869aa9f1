"""An analysis, not a policy: why the returning requests in a trace's p99
tail are slow, request by request (issue 45, item 2). Runs POLICY on a
trace from its first arrival (or from START), with the session-return model
trained on another whole trace (as `speckv simulate --returns-train-trace`),
and writes one JSON line per served request to OUT: its TTFT and where it
went (queue, promotion, pull, prefill), its reusable tokens (the floor's),
and, at its arrival, the truth of the cluster: the longest prefix of it each
node held (any tier, read without touching), the order its family had in
flight, the last RETURN and RETENTION forecasts its conversation had (time,
P) and the orders bought for it (their kind, target, and when they landed).

On the source build only (it wraps the route call, the order reports and the
return forecasts); on the compiled build the same run writes the records
without the truth columns (for a reference policy such as `none` or
`oracle`). Then `--causes OUT.jsonl [REF.jsonl ...]` classifies the returning
requests at or above OUT's returning p99 (docs/predictor.md, "Why the warm
start stops short of 0.9x"):

    PYTHONPATH=.shim python docs/scripts/returning_tail_causes.py OUT.jsonl \
        ../shared/traces/mooncake_conversation_trace.jsonl 8 predictive ../shared/traces/mooncake_synthetic_trace.jsonl
    python docs/scripts/returning_tail_causes.py --causes OUT.jsonl NONE.jsonl ORACLE.jsonl
"""
import collections
import json
import math
import sys
from pathlib import Path

import numpy as np

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.experiments.metrics import is_returning, request_key
from speckv.loadgen.experiments.ttft_floor import slice_floor
from speckv.loadgen.sim import jobs as J
from speckv.loadgen.sim import returns as returns_module
from speckv.loadgen.sim import scheduler_side
from speckv.loadgen.sim.returns import train_returns
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.scaled import SliceView

HISTORY = 40  # forecasts kept per conversation and kind (one a second while in the top list)


class Watch:
    """What the wrappers saw, for the request being routed."""

    def __init__(self) -> None:
        self.forecasts = collections.defaultdict(lambda: collections.deque(maxlen=HISTORY))  # (kind, family) -> (t, p)
        self.orders = collections.defaultdict(list)  # family -> [order record]
        self.by_id = {}
        self.at_arrival = {}  # request id -> truth at its route

    def wrap_forecasts(self):
        original = returns_module.ReturnForecasts.forecast

        def forecast(source, now, horizon_s, max_families):
            out = original(source, now, horizon_s, max_families)
            if source._at == now:  # a fresh list, not the cached one
                for f in out:
                    self.forecasts[(f.kind.name, str(f.family))].append((now, f.expected_count))
            return out
        returns_module.ReturnForecasts.forecast = forecast

    def wrap_reports(self, sim):
        original = scheduler_side.report

        def report(sim_, order, state, message="", nbytes=0, blocks=0):
            spec, now = order.spec, sim_.queue.now()
            rec = self.by_id.get(order.order_id)
            if rec is None:
                rec = dict(id=order.order_id, kind=spec.action.name, family=str(spec.family), target=str(spec.target),
                           created=now, blocks=len(spec.block_hashes), states=[])
                self.by_id[order.order_id] = rec
                self.orders[rec["family"]].append(rec)
            rec["states"].append((state.name, now))
            return original(sim_, order, state, message, nbytes, blocks)
        scheduler_side.report = report

    def wrap_route(self, sim):
        original = sim.core.route

        def route(request_id, hashes, prompt_tokens, family, *a, **k):
            if not request_id.startswith("warm-"):
                now = sim.queue.now()
                held = {str(n): sim.kv[n]._longest_prefix(hashes) for n in sim.ids}
                inflight = [o for o in self.orders.get(str(family), ())
                            if o["created"] <= now and not any(s in ("COMMITTED", "FAILED", "EXPIRED", "CANCELLED")
                                                               for s, _ in o["states"])]
                self.at_arrival[request_id] = dict(
                    held=held, blocks=len(hashes), inflight=[(o["kind"], o["target"]) for o in inflight],
                    ret=list(self.forecasts.get(("RETURN", str(family)), ())),
                    retention=list(self.forecasts.get(("RETENTION", str(family)), ())))
            return original(request_id, hashes, prompt_tokens, family, *a, **k)
        try:
            sim.core.route = route
            return True
        except AttributeError:  # the compiled build: no truth columns
            return False


def run(out: str, trace: str, nodes: int, policy: str, train_trace: str, start: float | None,
        duration: float | None = None) -> None:
    config = load_e2e_config(None)
    job = J.Job(trace, 7, nodes, policy, start, duration, "builtin", 1.0, None)
    workload, _ = J.build_workload(job, config)
    first = start if start is not None else float(workload.times[0])
    lo, hi = workload.window(first, math.inf if duration is None else first + duration)
    hlo, _ = workload.window(first - config.warmup_s, first)
    history = [workload[i] for i in range(hlo, lo)]
    requests = J.load_base(Path(train_trace), config)
    trained = train_returns(requests, max(r.arrival_s for r in requests) + 1.0, Path(train_trace).name)
    watch = Watch()
    watch.wrap_forecasts()
    sim = Simulation(config, SimSettings.from_e2e(config, nodes=nodes), policy, SliceView(workload, lo, hi), history,
                     future=workload, returns=trained)
    traced = watch.wrap_route(sim)
    if traced:
        watch.wrap_reports(sim)
    result = sim.run()
    floor = slice_floor([], workload.base, config.profile).rows(workload.base_rows(lo, hi))
    reusable, shared = floor.by_request_key(), floor.shared_by_request_key()
    floor_ms = {request_key(i): float(x) for i, x in enumerate(floor.floor_ms)}
    with open(out, "w") as f:
        for r in result.records:
            if not r.served:
                continue
            row = dict(id=r.request_id, t=r.arrival_s, family=r.family, prompt=r.prompt_tokens, ttft=r.ttft_ms,
                       queue=r.queue_ms, promote=r.promote_ms, pull=r.fetch_ms, cached=r.cached_tokens,
                       fetched=r.fetched_tokens, node=r.node_id, reusable=reusable.get(r.request_id, 0),
                       shared=shared.get(r.request_id, 0), floor=floor_ms.get(r.request_id),
                       returning=is_returning(r.request_id, reusable, shared), replica_blocks=r.replica_blocks)
            if traced:
                truth = watch.at_arrival.get(r.request_id, {})
                family_orders = [o for o in watch.orders.get(r.family, ()) if o["created"] <= r.arrival_s]
                row.update(truth, orders=[dict(kind=o["kind"], target=o["target"], created=o["created"],
                                               states=o["states"]) for o in family_orders[-6:]])
            f.write(json.dumps(row) + "\n")
    print(policy, "returning p99", np.percentile([r.ttft_ms for r in result.records if r.served and is_returning(
        r.request_id, reusable, shared)], 99), "replicas committed (blocks)", result.replicas.committed_blocks)


RETAIN_WINDOW_S = 300.0  # policies.json retain.ttl_s: the longest any action looks ahead


def cause(row: dict, block_tokens: int, first_seen: dict, gap_s: float | None = None) -> str:
    """One class per tail request (docs/predictor.md lists them); gap_s:
    since the conversation's previous turn arrived."""
    if first_seen[row["family"]] >= row["t"]:
        return "no earlier turn replayed (a copy's wrap point): nothing to reuse"
    if row["queue"] >= row["ttft"] / 2:
        return "queued behind other prefills for half its TTFT or more"
    used = min(row["cached"] + row["fetched"], row["reusable"])
    if row["reusable"] - used <= block_tokens:
        return "hit: its prefix was cached; slow by queue" if row["queue"] >= 1000 else \
            "hit: its prefix was cached; slow by the new tokens' prefill"
    best = max(row["held"].values()) * block_tokens if row.get("held") else None
    if best is None:
        return "miss (untraced)"
    if best >= row["reusable"] - block_tokens:
        return "miss: held elsewhere, routed away (queue)"
    if row["inflight"]:
        return "miss: a copy in flight (too late)"
    recent = [p for t, p in row["ret"] if row["t"] - t <= 15.0]
    bought = [o for o in row["orders"] if row["t"] - o["created"] <= 300.0]
    if bought:
        return "miss: evicted although bought (" + "/".join(sorted({o["kind"] for o in bought})) + ")"
    if any(p >= 0.05 for p in recent) or any(p >= 0.1 for _, p in row["retention"][-1:]):
        return "miss: evicted; forecast, nothing bought (price)"
    if gap_s is not None and gap_s > RETAIN_WINDOW_S:
        return "miss: evicted; back after more than the retain window, beyond every forecast horizon"
    return "miss: evicted; forecast below the floors"


def causes(path: str, refs: list[str]) -> None:
    rows = [json.loads(line) for line in open(path)]
    ref = {p: {r["id"]: r for r in map(json.loads, open(p))} for p in refs}
    returning = [r for r in rows if r["returning"]]
    p99 = float(np.percentile([r["ttft"] for r in returning], 99))
    tail = sorted((r for r in returning if r["ttft"] >= p99), key=lambda r: -r["ttft"])
    block = load_e2e_config(None).block_tokens
    first_seen = {}
    for r in rows:
        first_seen[r["family"]] = min(first_seen.get(r["family"], math.inf), r["t"])
    print(f"{len(returning)} returning requests, p99 {p99:.0f} ms, {len(tail)} at or above it")
    previous, last = {}, {}
    for r in sorted(rows, key=lambda r: r["t"]):
        previous[r["id"]] = last.get(r["family"])
        last[r["family"]] = r["t"]

    def why(r: dict) -> str:
        return cause(r, block, first_seen, None if previous[r["id"]] is None else r["t"] - previous[r["id"]])
    counts = collections.Counter(why(r) for r in tail)
    ttfts = np.array([r["ttft"] for r in returning])
    index = {r["id"]: i for i, r in enumerate(returning)}
    for c, n in counts.most_common():
        fixed = ttfts.copy()
        for r in tail:
            if why(r) == c:
                fixed[index[r["id"]]] = r["floor"]
        print(f"  {n:3d}  {c}; with these at their floor the returning p99 is {np.percentile(fixed, 99):.0f}")
    floors = np.array([r["floor"] for r in returning])
    print(f"the floor's returning p99 (every reusable token cached, an idle node): {np.percentile(floors, 99):.0f}")
    for c in counts:
        part = [r for r in tail if why(r) == c]
        gaps = [r["t"] - previous[r["id"]] for r in part if previous[r["id"]] is not None]
        p_keep = [r["retention"][-1][1] for r in part if r.get("retention")]
        print(f"  {c}: prompt median {np.median([r['prompt'] for r in part]):.0f} tokens, queue median "
              f"{np.median([r['queue'] for r in part]):.0f} ms, since the conversation's last turn median "
              f"{np.median(gaps) if gaps else float('nan'):.0f} s, last RETENTION P median "
              f"{np.median(p_keep) if p_keep else float('nan'):.3f}")
        for p in refs:
            mine = [ref[p][r["id"]]["ttft"] for r in part if r["id"] in ref[p]]
            print(f"    the same requests under {Path(p).stem}: TTFT median {np.median(mine) if mine else float('nan'):.0f}"
                  f" ms, at or above this run's p99: {sum(t >= p99 for t in mine)} of {len(mine)}")
    for r in tail:
        others = " ".join(f"{Path(p).stem} {ref[p][r['id']]['ttft']:.0f}" if r["id"] in ref[p] else "" for p in refs)
        gap = r["t"] - max((o["created"] for o in r.get("orders", [])), default=-math.inf)
        print(f"{r['id']} t {r['t']:.1f} ttft {r['ttft']:.0f} queue {r['queue']:.0f} prompt {r['prompt']} reusable "
              f"{r['reusable']} used {r['cached'] + r['fetched']} on {r['node']} held max "
              f"{max(r.get('held', {'-': 0}).values()) * block} | {others} | {why(r)} | last RETURN "
              f"{r.get('ret', [])[-1:]} RETENTION {r.get('retention', [])[-1:]} orders {len(r.get('orders', []))} "
              f"last {gap:.0f} s before")


if __name__ == "__main__":
    if sys.argv[1] == "--causes":
        causes(sys.argv[2], sys.argv[3:])
        sys.exit(0)
    run(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5],
        float(sys.argv[6]) if len(sys.argv) > 6 else None, float(sys.argv[7]) if len(sys.argv) > 7 else None)
