"""`speckv simulate`: the end-to-end comparison in virtual time, at any
number of nodes, with the JSON keys and report of `speckv bench e2e` plus
wall time and simulated events per second.

    speckv simulate --trace PATH --nodes 8,64,256,1024 --policies ... [--json PATH] [--report DIR]
    speckv simulate --synthetic SCENARIO [--scenarios PATH] --nodes 64 ...

--synthetic names a scenario of services/config/scenarios.json (or of the
file given by --scenarios): a generator (Markov-modulated Poisson or
Hawkes) with its parameters, sized for the configuration's node count, and
scaled with copies like a trace.

Each (node count, policy) is one Simulation (simulation.py) in a worker
process of its own (--jobs at once, default one more than the cores: see
default_jobs; spawned, never forked, and never reused: a finished
simulation's memory goes back to the machine, and its `peak_rss_mb` is its
own). The
trace is replayed whole by default (--start-s / --duration-s pick a slice);
for more nodes than the configuration's it is merged with time-rotated
copies of itself (workload.py), which the notes say. Burst windows are fixed
from the whole (scaled) workload, as bench e2e fixes them from the trace.

--compiled (default auto): the workers run on the mypyc-compiled build of the
hot modules (compiled.py; `make sim-compiled` builds it) when it matches the
source, else on the source; the console and the JSON's "code" say which.

The predictor runs only in the simulations of the policies that read its
forecasts (FORECAST_POLICIES: predictive), so only their report time lines
draw forecasts; the live bench draws the same line for every policy.

--predictor lightgbm: the model is trained once, in this process before any
worker starts, on the base trace alone (copy 0: the requests in
[start - warmup_s, start) that the configuration's own node count sees), and
handed to every worker inside its Job. Training on the merged history of
every copy cost 13 GB per worker at 256 nodes. With --train-trace PATH it is
trained on the whole of that other trace instead, so a replay from the first
arrival (nothing before it to train on) still gets LightGBM.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Mapping, Sequence

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from speckv.loadgen.experiments.e2e_config import E2EConfig, load_e2e_config
from speckv.loadgen.experiments.metrics import burst_seconds, summarize
from speckv.loadgen.experiments.report import FLOOR_ROW, TABLE_COLUMNS, fmt, markdown_table, write_report
from speckv.loadgen.experiments.ttft_floor import floor_summary, slice_floor
from speckv.loadgen.sim.compiled import PackageRoots, default_dir, running_compiled, why_not_current
from speckv.loadgen.sim.machine import describe_machine, peak_rss_mb
from speckv.loadgen.sim.parent_watch import exit_with_parent
from speckv.loadgen.sim.predictor import (
    PREDICTOR_KINDS,
    TrainedPredictor,
    lightgbm_note,
    train_on_base,
    train_on_other_trace,
)
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.scaled import ScaledTrace, SliceView, copies_for
from speckv.loadgen.workload.scenarios import get_scenario, load_scenarios
from speckv.services.cluster.status import wide_console
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from speckv.services.common.traces import TraceRequest, load_mooncake, load_trace, trace_format
from speckv.services.scheduler.policies.registry import FORECAST_POLICIES

ALL_POLICIES = "none,reactive-heat,reactive-migrate,predictive,oracle"
# A simulation allocates millions of small, long-lived objects (index sets,
# records, events) and, with the builtin predictor, makes no cyclic garbage
# while it runs (tests/unit/loadgen/sim/test_simulation_no_cycles.py holds it to that).
# Automatic collection found nothing to free and cost 3 % of a 256-node hour
# traversing them, so it is off for the whole of such a job (run_job); a whole
# 256-node hour peaks at the same RSS either way (1171 against 1172 MB).
# LightGBM's predict leaves ctypes cycles (about 10 objects per forecast), so
# a simulation serving it keeps collection on, at these thresholds: CPython's
# default young generation (700 allocations) scanned the live objects
# thousands of times, 13 % of a run's CPU.
LIGHTGBM_GC_THRESHOLDS = (100_000, 20, 10)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="speckv simulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", help="trace file (Mooncake JSONL, Azure or BurstGPT CSV)")
    p.add_argument("--synthetic", metavar="SCENARIO",
                   help="a named synthetic bursty workload instead of --trace (see --scenarios)")
    p.add_argument("--scenarios", default=None,
                   help="scenario file for --synthetic (default: the committed services/config/scenarios.json: "
                        f"{', '.join(load_scenarios())})")
    p.add_argument("--nodes", default=None, help="node count, or a comma-separated list (default: the config's)")
    p.add_argument("--policies", default=ALL_POLICIES, help="comma-separated")
    p.add_argument("--start-s", type=float, default=None, help="slice start, trace s (default: the first arrival)")
    p.add_argument("--duration-s", type=float, default=None, help="slice length, trace s (default: to the end)")
    p.add_argument("--predictor", choices=PREDICTOR_KINDS, default="builtin",
                   help="builtin EWMA (as the live cluster) or LightGBM trained on the trace before the slice")
    p.add_argument("--train-trace", default=None,
                   help="with --predictor lightgbm: train on the whole of this other trace instead of the "
                        "replayed trace's time before the slice")
    p.add_argument("--speed", type=float, default=1.0,
                   help="match a live run replayed this many times faster (its wall-clock intervals, in trace s)")
    p.add_argument("--seed", type=int, default=7, help="synthetic workload seed")
    p.add_argument("--jobs", type=int, default=None,
                   help="simulations run at once (default: one more than the machine's cores, see default_jobs)")
    p.add_argument("--compiled", choices=("auto", "on", "off"), default="auto",
                   help="run the workers on the mypyc-compiled modules (make sim-compiled builds them; about 2x "
                        "faster, identical results): auto uses them when they match the source, on requires them")
    p.add_argument("--compiled-dir", default=None,
                   help="where the compiled build is (default: build/sim-compiled at the project root)")
    p.add_argument("--config", default=None, help="e2e config JSON (default: the committed one)")
    p.add_argument("--json", default=None, help="write the result JSON here")
    p.add_argument("--report", default=None, help="write the HTML report(s) into this directory")
    args = p.parse_args(list(argv))
    if args.train_trace and args.predictor != "lightgbm":
        raise InvalidArgument("--train-trace trains the LightGBM predictor: give --predictor lightgbm too")
    if bool(args.trace) == bool(args.synthetic):
        raise InvalidArgument("give exactly one of --trace PATH and --synthetic SCENARIO")
    if args.scenarios and not args.synthetic:
        raise InvalidArgument("--scenarios names the file of --synthetic scenarios: give --synthetic too")
    args.policy_list = [x.strip() for x in args.policies.split(",") if x.strip()]
    if not args.policy_list or len(set(args.policy_list)) != len(args.policy_list):
        raise InvalidArgument(f"--policies={args.policies!r}: name each policy once")
    try:
        args.node_list = [int(x) for x in args.nodes.split(",")] if args.nodes else []
    except ValueError:
        raise InvalidArgument(f"--nodes={args.nodes!r}: expected integers, e.g. 8,64,256") from None
    if any(n < 1 for n in args.node_list) or (args.jobs is not None and args.jobs < 1) or args.speed <= 0:
        raise InvalidArgument("--nodes >= 1, --jobs >= 1 and --speed > 0 are required")
    return args


@dataclass(frozen=True, slots=True)
class Job:
    """One simulation, as a worker receives it (everything it needs to rebuild the workload)."""

    source: str  # trace path, or a scenario name when synthetic
    seed: int
    nodes: int
    policy: str
    start_s: float | None
    duration_s: float | None
    predictor: str
    speed: float
    config_path: str | None
    trained: TrainedPredictor | None = None  # the lightgbm model, trained once by main; None: run_job trains it
    synthetic: bool = False
    scenarios_path: str | None = None

    @property
    def serves_lightgbm(self) -> bool:
        """Its simulation runs the predictor (the policy reads forecasts) with the LightGBM model."""
        return self.predictor == "lightgbm" and self.policy in FORECAST_POLICIES


def build_workload(job: Job, config: E2EConfig) -> tuple[ScaledTrace, list[str]]:
    """The (scaled) workload and notes saying what it is."""
    copies = copies_for(job.nodes, config.nodes)
    if job.synthetic:
        scenario = get_scenario(job.source, job.seed, config.block_tokens, job.scenarios_path)
        base = scenario.requests()
        notes = [f"Synthetic workload '{scenario.name}', sized for {config.nodes} nodes: "
                 f"{json.dumps(scenario.describe())}"]
    else:
        path = Path(job.source)
        base = _load(path, config)
        notes = [f"Real trace {path.name}, {len(base)} requests, replayed whole unless a slice is given."]
    workload = ScaledTrace(base, copies)
    if copies > 1:
        notes.append(f"{job.nodes} nodes: the workload is merged with {copies - 1} copies of itself (copy k's "
                     f"block hashes offset by k x (max hash + 1), families prefixed 'c<k>:', arrivals rotated by "
                     f"k/{copies} of its span), {len(workload)} requests in all, one copy per {config.nodes} nodes "
                     "(the live configuration's node count for one trace).")
    return workload, notes


def _load(path: Path, config: E2EConfig) -> list[TraceRequest]:
    # Mooncake traces are keyed into families as bench e2e keys them (the config's model.family).
    return load_mooncake(path, family=config.family) if trace_format(path) == "mooncake" else load_trace(path)


def run_job(job: Job, progress=None) -> dict:
    """One simulation; returns its summary and what the report draws (small, picklable).

    Collection (see _collection_for) is set for the whole job and restored
    only once _run_job has returned, so its workload and simulation are
    already freed: with collection off, every object the job made stays in
    the young generation, and the first collection after it is re-enabled
    would otherwise traverse millions of live objects (seconds, per job)."""
    with _collection_for(job):
        return _run_job(job, progress)


def _run_job(job: Job, progress) -> dict:
    config = load_e2e_config(job.config_path)
    workload, notes = build_workload(job, config)
    start = job.start_s if job.start_s is not None else float(workload.times[0]) if len(workload) else 0.0
    end = start + job.duration_s if job.duration_s is not None else math.inf
    lo, hi = workload.window(start, end)
    hlo, _ = workload.window(start - config.warmup_s, start)
    history = [workload[i] for i in range(hlo, lo)]
    settings = SimSettings.from_e2e(config, nodes=job.nodes, speed=job.speed, predictor=job.predictor)
    trained = job.trained
    if job.serves_lightgbm:
        trained = trained or train_on_base(workload, start, config.warmup_s)  # run alone: the same model
        notes.append(lightgbm_note(trained, config.nodes, config.warmup_s, workload.copies))

    def report(total: int, done: int, _record) -> None:
        if progress is not None and (done % 500 == 0 or done == total):
            progress.put((job.nodes, job.policy, done, total))

    sim = Simulation(config, settings, job.policy, SliceView(workload, lo, hi), history, report,
                     future=workload, trained=trained)
    run = sim.run()
    bursts = burst_seconds(workload.times.tolist())
    # Each copy's floor is its base request's: copies have disjoint blocks, and
    # only the rotation's wrap point (a conversation split across it) differs.
    floor = slice_floor([], workload.base, config.profile).rows(workload.base_rows(lo, hi))
    summary = summarize(run.records, bursts, config.ttft_target_ms, run.replicas, config.real_bytes_per_block,
                        run.orders, floor.by_request_key(), config.profile)
    summary.update({"wall_s": run.wall_s, "cpu_s": run.cpu_s, "simulated_events": run.events,
                    "events_per_s": run.events / run.cpu_s if run.cpu_s else None,
                    "virtual_s": run.virtual_s, "network_bytes": run.network_bytes,
                    "peak_rss_mb": round(peak_rss_mb(), 1)})
    return {"nodes": job.nodes, "policy": job.policy, "summary": summary, "notes": notes,
            "floor": floor_summary(floor.floor_ms, workload.times[lo:hi].tolist(), bursts),
            "predictor": run.predictor, "code": "mypyc" if running_compiled() else "python",
            "requests_in_slice": hi - lo, "burst_seconds": len(bursts),
            "slice": {"start_s": start, "duration_s": (float(workload.times[hi - 1]) - start) if hi > lo else 0.0,
                      "speed": job.speed},
            "ttfts": [r.ttft_ms for r in run.records if r.served],
            "arrivals": [(r.arrival_s, r.family) for r in run.records] if hi - lo <= 50_000 else [],
            "timeline": {"forecasts": run.forecasts,
                         "commits": [(t, b * config.real_bytes_per_block, f) for t, b, f in run.replicas.commits]}}


@contextlib.contextmanager
def _collection_for(job: Job):
    """Automatic collection as the comment on LIGHTGBM_GC_THRESHOLDS says: off
    unless the job's predictor runs LightGBM."""
    was_enabled, thresholds = gc.isenabled(), gc.get_threshold()
    if job.serves_lightgbm:
        gc.set_threshold(*LIGHTGBM_GC_THRESHOLDS)
    else:
        gc.disable()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if was_enabled:
            gc.enable()


# Each worker's BLAS pool: numpy's OpenBLAS starts one thread per core in every
# process, so two workers on two cores ran four busy-waiting threads in the
# predictor's ring products.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def _worker_environment(code_path: Path | None, blas_threads: int, environ: Mapping[str, str]):
    """What spawned workers start with: sys.path with the compiled build
    first (this process keeps the modules it already imported, and imports
    new speckv modules through the package it has, so only the workers run
    compiled code), and blas_threads BLAS threads each unless the user's
    environment sets its own."""
    saved_path = list(sys.path)
    saved_env = {k: os.environ.get(k) for k in BLAS_THREAD_VARS}
    if code_path is not None:
        sys.path.insert(0, str(code_path))
    for key in BLAS_THREAD_VARS:
        if key not in environ:
            os.environ[key] = str(blas_threads)
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def compiled_build(mode: str, folder: str | None) -> tuple[Path | None, str]:
    """The compiled build to run on (None: the source), and a line saying which and why."""
    roots = PackageRoots.of_installed()
    tree = Path(folder) if folder else default_dir(roots)
    if mode == "off":
        return None, "code: python source (--compiled off)"
    why = why_not_current(tree, roots)
    if why is None:
        return tree, f"code: mypyc-compiled modules from {tree}"
    if mode == "on":
        raise FailedPrecondition(f"--compiled on: {why}")
    return None, f"code: python source; {why}"


def default_jobs(cores: int) -> int:
    """Simulations run at once by default: one more than the cores. A
    simulation cannot be split, so with exactly one per core the last round
    leaves cores idle while the longest jobs finish (five policies on two
    cores: one worker runs three of them). One more process than cores
    shares the cores among the jobs still running, which keeps every core
    busy to near the end. Measured on a 2-core VM, the 256-node hour with
    all five policies: with two workers the wall time was 1.17x the CPU time
    spread over both cores (one worker ran three policies alone at the end),
    with three 1.07x. Their wall times (780 and 823 s) do not compare: the VM
    slowed in between (the reference loop, machine.py, took 32 then 41 ms)."""
    return max(1, cores) + 1


def submission_order(jobs: Sequence[Job]) -> list[Job]:
    """Longest first, so the short ones fill the last round instead of a
    worker idling while the longest runs alone at the end (longest
    processing time first). A job's cost grows with its node count, and at
    one count the policies that run the predictor (FORECAST_POLICIES) take
    the longest: about 1.5-2x `none` at 256 nodes. Otherwise the order given."""
    return sorted(jobs, key=lambda j: (-j.nodes, j.policy not in FORECAST_POLICIES))


def run_all(jobs: list[Job], workers: int, console, code_path: Path | None = None,
            environ: Mapping[str, str] | None = None) -> list[dict]:
    columns = (TextColumn("{task.description:>24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    results: list[dict] = []
    with Progress(*columns, console=console) as bar:
        tasks = {(j.nodes, j.policy): bar.add_task(f"{j.nodes} nodes {j.policy}", total=None) for j in jobs}
        ctx = multiprocessing.get_context("spawn")
        blas_threads = max(1, (os.cpu_count() or 1) // workers)
        manager = SyncManager(ctx=ctx)  # serves the progress queue; it too exits with this process
        with _worker_environment(code_path, blas_threads, os.environ if environ is None else environ):
            manager.start(exit_with_parent, (os.getpid(),))
            with manager, ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=exit_with_parent,
                                              initargs=(os.getpid(),), max_tasks_per_child=1) as pool:
                queue = manager.Queue()
                futures = [pool.submit(run_job, j, queue) for j in submission_order(jobs)]
                pending = set(futures)
                while pending:
                    while not queue.empty():
                        nodes, policy, done, total = queue.get()
                        bar.update(tasks[(nodes, policy)], completed=done, total=total)
                    finished = {f for f in pending if f.done()}
                    for f in finished:
                        results.append(_result_of(f, workers))
                    pending -= finished
                    time.sleep(0.2)
    return results


def _result_of(future, workers: int) -> dict:
    """A finished simulation's result; a worker that died (the kernel's
    out-of-memory killer, most often) is a ResourceExhausted naming the fix."""
    try:
        return future.result()
    except BrokenProcessPool:
        raise ResourceExhausted(
            f"a simulation worker died before it finished ({workers} ran at once). The usual cause is memory: "
            "each simulation's peak is its JSON's peak_rss_mb (about 1.2 GB for the 256-node hour, 3 GB at "
            "1,024 nodes); rerun with fewer --jobs") from None


def assemble(results: list[dict], args: argparse.Namespace, config: E2EConfig) -> dict:
    """The bench-e2e-shaped result for the largest node count, plus every count under by_nodes."""
    by_nodes: dict[str, dict] = {}
    for r in sorted(results, key=lambda r: (r["nodes"], args.policy_list.index(r["policy"]))):
        entry = by_nodes.setdefault(str(r["nodes"]), {"policies": {}, "requests": r["requests_in_slice"],
                                                      "notes": r["notes"], "floor": r["floor"]})
        entry["policies"][r["policy"]] = r["summary"]
    top = max(results, key=lambda r: r["nodes"])
    nodes = top["nodes"]
    predictor = next((r["predictor"] for r in results if r["policy"] in FORECAST_POLICIES),
                     "not run (no policy here reads forecasts)")
    total_cpu = sum(r["summary"]["cpu_s"] for r in results)
    total_events = sum(r["summary"]["simulated_events"] for r in results)
    return {
        "trace": Path(args.trace).name if args.trace else f"synthetic:{args.synthetic}",
        "slice": top["slice"], "ttft_target_ms": config.ttft_target_ms, "byte_scale_factor": 1,
        "nodes": nodes, "engine_profile": config.profile.name, "link_gbps": config.link.gbps,
        "real_bytes_per_block": config.real_bytes_per_block, "burst_seconds_in_trace": top["burst_seconds"],
        "policies": by_nodes[str(nodes)]["policies"], "floor": by_nodes[str(nodes)]["floor"], "simulated": True,
        "wall_s": args.wall_s, "simulated_events": total_events,
        "code": ",".join(sorted({r["code"] for r in results})),
        "cpu_s": total_cpu, "events_per_s": total_events / total_cpu if total_cpu else None,
        "peak_rss_mb": max(r["summary"]["peak_rss_mb"] for r in results),
        "by_nodes": by_nodes,
        "scale": {n: {p: {"burst_ttft_p99_ms": m["burst_ttft_p99_ms"], "bytes_replicated": m["bytes_replicated"]}
                      for p, m in e["policies"].items()} for n, e in by_nodes.items()},
        "notes": [*top["notes"], f"Simulated in virtual time (speckv simulate): predictor {predictor}, run only in the "
                  f"simulations of the policies that read its forecasts ({', '.join(sorted(FORECAST_POLICIES))}); "
                  "bytes are the real model's (no scaling in simulation); transfers share each node's "
                  f"{config.link.gbps:g} Gbit/s link (processor sharing), {config.link.overhead_ms:g} ms each."],
    }


def scale_table(result: dict) -> str:
    policies = list(next(iter(result["by_nodes"].values()))["policies"])
    lines = ["| nodes | " + " | ".join(f"{p} burst p99 ms" for p in policies) + " | floor burst p99 ms | "
             + " | ".join(f"{p} GiB replicated" for p in policies) + " |",
             "|---:|" + "---:|" * (2 * len(policies) + 1)]
    for n, entry in result["by_nodes"].items():
        ps = entry["policies"]
        floor = (entry.get("floor") or {}).get("burst_ttft_p99_ms")
        lines.append(f"| {n} | " + " | ".join(fmt("burst_ttft_p99_ms", ps[p].get("burst_ttft_p99_ms")) for p in policies)
                     + f" | {fmt('burst_ttft_p99_ms', floor)} | "
                     + " | ".join(fmt("bytes_replicated", ps[p].get("bytes_replicated")) for p in policies) + " |")
    return "\n".join(lines)


def write_reports(result: dict, results: list[dict], out: Path, console) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for n in result["by_nodes"]:
        mine = [r for r in results if str(r["nodes"]) == n]
        sub = {**result, "nodes": int(n), "policies": result["by_nodes"][n]["policies"],
               "floor": result["by_nodes"][n]["floor"],
               "notes": result["by_nodes"][n]["notes"] + result["notes"][-1:]}
        arrivals: list[tuple[float, str]] = next((r["arrivals"] for r in mine if r["arrivals"]), [])
        index = write_report(out / f"nodes-{n}", sub, {r["policy"]: r["ttfts"] for r in mine},
                             {r["policy"]: r["timeline"] for r in mine}, arrivals)
        console.print(f"report ({n} nodes): {index}")
    (out / "scale.md").write_text(scale_table(result) + "\n")
    (out / "result.json").write_text(json.dumps(result, indent=2))


def print_tables(result: dict, console) -> None:
    for n, entry in result["by_nodes"].items():
        table = Table(title=f"simulated, {n} nodes (TTFT in real-model ms)")
        table.add_column("policy")
        for _, title in TABLE_COLUMNS:
            table.add_column(title, justify="right")
        table.add_column("wall s", justify="right")
        table.add_column("CPU s", justify="right")
        table.add_column("events/CPU s", justify="right")
        table.add_column("peak MiB", justify="right")
        for name, m in entry["policies"].items():
            table.add_row(name, *(fmt(k, m.get(k)) for k, _ in TABLE_COLUMNS), f"{m['wall_s']:.1f}",
                          f"{m['cpu_s']:.1f}", f"{m['events_per_s']:.0f}", f"{m['peak_rss_mb']:.0f}")
        if entry.get("floor"):
            table.add_row(FLOOR_ROW, *(fmt(k, entry["floor"].get(k)) for k, _ in TABLE_COLUMNS), "", "", "", "",
                          style="dim")
        console.print(table)
        console.print(markdown_table(entry["policies"], entry.get("floor")), markup=False)
    console.print(scale_table(result), markup=False)


def train_once(args: argparse.Namespace, config: E2EConfig, first: Job, console) -> TrainedPredictor | None:
    """The LightGBM model every worker serves, trained here once (each
    worker training on its merged history ran out of memory); None for the
    builtin predictor, or when none of the policies asked for reads forecasts."""
    if args.predictor != "lightgbm" or not FORECAST_POLICIES.intersection(args.policy_list):
        return None
    if args.train_trace:
        with console.status(f"training LightGBM on {Path(args.train_trace).name}"):
            trained = train_on_other_trace(_load(Path(args.train_trace), config), Path(args.train_trace).name)
    else:
        with console.status("training LightGBM on the base trace before the slice"):
            base, _ = build_workload(replace(first, nodes=config.nodes), config)
            start = args.start_s if args.start_s is not None else float(base.times[0]) if len(base) else 0.0
            trained = train_on_base(base, start, config.warmup_s)
    console.print(f"predictor: {trained.description}")
    return trained


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    args = parse_args(argv)
    for path in (args.trace, args.train_trace):
        if path and not Path(path).exists():
            raise NotFound(f"trace {path} not found")
    config = load_e2e_config(args.config)
    code_path, code_line = compiled_build(args.compiled, args.compiled_dir)
    nodes = args.node_list or [config.nodes]
    source = str(Path(args.trace).resolve()) if args.trace else args.synthetic
    scenarios = str(Path(args.scenarios).resolve()) if args.scenarios else None
    if args.synthetic:  # a bad name or file fails here, before any worker starts
        get_scenario(args.synthetic, args.seed, config.block_tokens, scenarios)
    jobs = [Job(source, args.seed, n, p, args.start_s, args.duration_s, args.predictor, args.speed, args.config,
                synthetic=bool(args.synthetic), scenarios_path=scenarios)
            for n in nodes for p in args.policy_list]
    console = wide_console()
    console.print(code_line, markup=False)
    machine = describe_machine()
    began = time.perf_counter()
    trained = train_once(args, config, jobs[0], console)
    if trained is not None:
        jobs = [replace(j, trained=trained) for j in jobs]
    workers = min(args.jobs or default_jobs(os.cpu_count() or 1), len(jobs))
    results = run_all(jobs, workers, console, code_path, environ)
    args.wall_s = time.perf_counter() - began
    result = assemble(results, args, config)
    result["machine"] = machine
    print_tables(result, console)
    console.print(f"wall {args.wall_s:.1f} s for {len(jobs)} simulations in {workers} workers; "
                  f"{result['simulated_events']} events, {result['events_per_s']:.0f} events per CPU second; "
                  f"{machine['cores']} cores, reference loop {machine['reference_loop_ms']:.1f} ms (machine.py)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        console.print(f"JSON written to {args.json}")
    if args.report:
        write_reports(result, results, Path(args.report), console)
    return 1 if any(m["served"] == 0 for e in result["by_nodes"].values() for m in e["policies"].values()) else 0
