"""One simulation as a worker runs it: the Job it receives, the workload it
rebuilds, the predictor it trains or is handed, and the SimulationResult it
returns.

--predictor lightgbm: the model is trained once, in the command's process
before any worker starts (train_once), on the base trace alone (copy 0: the
requests in [start - warmup_s, start) that the configuration's own node count
sees), and handed to every worker inside its Job: training on the merged
history of every copy ran out of memory at 256 nodes. With --train-trace PATH
it is trained on the whole of that other trace instead, so a replay from the
first arrival (nothing before it to train on) still gets LightGBM.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from speckv.loadgen.experiments.bootstrap import BootstrapDraws, bootstrap_draws, intervals_of
from speckv.loadgen.experiments.e2e_config import E2EConfig, SliceSpec
from speckv.loadgen.experiments.event_metrics import event_figures
from speckv.loadgen.experiments.event_table import LOAD_WINDOW_S
from speckv.loadgen.experiments.metrics import burst_seconds, summarize
from speckv.loadgen.experiments.results import FloorSummary, PolicySummary, SimulatedRunFigures
from speckv.loadgen.experiments.ttft_floor import SliceFloor, floor_summary, slice_floor
from speckv.loadgen.experiments.utilisation import busy_series, utilisation
from speckv.loadgen.sim.ablation import parse_variant
from speckv.loadgen.sim.compiled import running_compiled
from speckv.loadgen.sim.machine import peak_rss_mb
from speckv.loadgen.sim.predictor import (
    TrainedPredictor,
    lightgbm_note,
    train_on_base,
    train_on_other_trace,
)
from speckv.loadgen.sim.returns import MIN_TRAINING_TURNS, TrainedReturns, train_returns
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import SimRun, Simulation
from speckv.loadgen.sim.sweep import CellKey, cell_config, cell_label
from speckv.loadgen.workload.node_events import get_event_set, resolve
from speckv.loadgen.workload.scaled import ScaledTrace, SliceView, copies_for
from speckv.loadgen.workload.scenarios import get_scenario
from speckv.services.common.traces import TraceRequest, load_mooncake, load_trace, trace_format
from speckv.services.scheduler.policies.registry import FORECAST_POLICIES

# A simulation allocates millions of small, long-lived objects (index sets,
# records, events) and, with the builtin predictor, makes no cyclic garbage
# while it runs (tests/unit/loadgen/sim/test_simulation_no_cycles.py holds it
# to that), so automatic collection would only traverse live objects: it is
# off for the whole of such a job (run_job). LightGBM's predict leaves ctypes
# cycles, so a simulation serving it keeps collection on, with a young
# generation large enough that it does not rescan the live objects thousands
# of times (docs/performance.md, "Garbage collection").
LIGHTGBM_GC_THRESHOLDS = (100_000, 20, 10)


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
    host_pages: int | None = None  # each node's host tier; None: the configuration's
    disk_pages: int | None = None  # each node's disk tier (blocks); None: the configuration's
    returns: TrainedReturns | None = None  # the session-return model (train_returns_once); None: none
    cell: CellKey = ()  # a --sweep cell's values (sweep.py); (): the configuration as it is
    events: str | None = None  # a node event set (workload/node_events.py); None: no events
    events_path: str | None = None  # the file naming it; None: the committed services/config/events.json
    load_nodes: int | None = None  # size the workload (copies) for this many nodes whatever `nodes` is; None: nodes
    online_learning: bool = False  # the return model learns online from the slice (online_returns.py)

    @property
    def label(self) -> str:
        """What the progress bar calls it: unique among one command's jobs."""
        where = f"{cell_label(self.cell)}, " if self.cell else ""
        disk = f", disk {self.disk_pages}" if self.disk_pages is not None else ""
        return f"{where}{self.nodes} nodes {self.policy}{disk}"

    @property
    def serves_lightgbm(self) -> bool:
        """Its simulation runs the predictor (the policy reads forecasts) with the LightGBM model."""
        return self.predictor == "lightgbm" and parse_variant(self.policy).policy in FORECAST_POLICIES


@dataclass(slots=True)
class SimulationResult:
    """What one simulation sends back to the command (small, picklable): its
    summary, and what its node count's row and report draw."""

    nodes: int
    policy: str
    summary: PolicySummary
    notes: list[str]
    floor: FloorSummary
    predictor: str
    code: str  # "mypyc" or "python": what the worker ran
    requests_in_slice: int
    burst_seconds: int
    slice: SliceSpec
    ttfts: list[float]
    arrivals: list[tuple[float, str]]  # (trace s, family); empty for a slice of more than 50,000 requests
    # "forecasts": (trace s, family, count within forecast_horizon_s trace s), "commits": (trace s, real bytes, family)
    timeline: dict[str, object]
    cell: CellKey = ()  # the Job's
    seed: int = 7  # the Job's (a synthetic workload's realization)
    draws: BootstrapDraws | None = None  # each interval figure per bootstrap draw, for paired differences
    disk_pages: int | None = None  # the Job's (None: the configuration's disk tier)


def build_workload(job: Job, config: E2EConfig) -> tuple[ScaledTrace, list[str]]:
    """The (scaled) workload and notes saying what it is."""
    copies = copies_for(job.load_nodes or job.nodes, config.nodes)
    if job.synthetic:
        scenario = get_scenario(job.source, job.seed, config.block_tokens, job.scenarios_path)
        base = scenario.requests()
        notes = [f"Synthetic workload '{scenario.name}', sized for {config.nodes} nodes: "
                 f"{json.dumps(scenario.describe())}"]
    else:
        path = Path(job.source)
        base = load_base(path, config)
        notes = [f"Real trace {path.name}, {len(base)} requests, replayed whole unless a slice is given."]
    workload = ScaledTrace(base, copies)
    if copies > 1:
        notes.append(f"{job.load_nodes or job.nodes} nodes' load: the workload is merged with {copies - 1} copies of "
                     "itself (copy k's "
                     f"block hashes offset by k x (max hash + 1), families prefixed 'c<k>:', arrivals rotated by "
                     f"k/{copies} of its span), {len(workload)} requests in all, one copy per {config.nodes} nodes "
                     "(the live configuration's node count for one trace).")
    return workload, notes


def load_base(path: Path, config: E2EConfig) -> list[TraceRequest]:
    # Mooncake traces are keyed into families as bench e2e keys them (the config's model.family).
    return load_mooncake(path, family=config.family) if trace_format(path) == "mooncake" else load_trace(path)


def run_job(job: Job, progress=None) -> SimulationResult:
    """One simulation; returns its summary and what the report draws (small, picklable).

    Collection (see collection_for) is set for the whole job and restored
    only once _run_job has returned, so its workload and simulation are
    already freed: with collection off, every object the job made stays in
    the young generation, and the first collection after it is re-enabled
    would otherwise traverse millions of live objects (seconds, per job)."""
    with collection_for(job):
        return _run_job(job, progress)


@dataclass(slots=True)
class PreparedWorkload:
    """What every policy's simulation of one (workload, seed, node count,
    slice) shares: the configuration, the (scaled) workload, the slice's
    rows [lo, hi) of it, the history before the slice, the burst seconds and
    the floor. Built once by prepare; read only by run_prepared."""

    config: E2EConfig
    workload: ScaledTrace
    notes: list[str]
    start_s: float
    lo: int
    hi: int
    history: list[TraceRequest]
    bursts: frozenset[int]
    floor: SliceFloor


def prepare(job: Job) -> PreparedWorkload:
    """The shared part of job's simulation (its policy is not read)."""
    config = cell_config(job.config_path, job.cell)
    workload, notes = build_workload(job, config)
    start = job.start_s if job.start_s is not None else float(workload.times[0]) if len(workload) else 0.0
    end = start + job.duration_s if job.duration_s is not None else math.inf
    lo, hi = workload.window(start, end)
    hlo, _ = workload.window(start - config.warmup_s, start)
    # Each copy's floor is its base request's: copies have disjoint blocks, and
    # only the rotation's wrap point (a conversation split across it) differs.
    floor = slice_floor([], workload.base, config.profile).rows(workload.base_rows(lo, hi))
    return PreparedWorkload(config, workload, notes, start, lo, hi, [workload[i] for i in range(hlo, lo)],
                            burst_seconds(workload.times.tolist()), floor)


def _run_job(job: Job, progress) -> SimulationResult:
    return run_prepared(job, prepare(job), progress)


def run_prepared(job: Job, prepared: PreparedWorkload, progress=None) -> SimulationResult:
    """job's simulation on its prepared workload (prepare(job), or that of a
    job differing from it only in policy or model): the same result as
    run_job's. The caller sets collection (collection_for)."""
    config, workload, lo, hi, start = prepared.config, prepared.workload, prepared.lo, prepared.hi, prepared.start_s
    notes = list(prepared.notes)
    settings = replace(SimSettings.from_e2e(config, nodes=job.nodes, speed=job.speed, predictor=job.predictor,
                                            host_pages=job.host_pages, disk_pages=job.disk_pages),
                       online_returns=job.online_learning)
    trained = job.trained
    if job.serves_lightgbm:
        trained = trained or train_on_base(workload, start, config.warmup_s)  # run alone: the same model
        notes.append(lightgbm_note(trained, config.nodes, config.warmup_s, workload.copies))

    def report(total: int, done: int, _record) -> None:
        if progress is not None and (done % 500 == 0 or done == total):
            progress.put((job.label, done, total))

    node_events = (resolve(get_event_set(job.events, job.events_path), workload.times[lo:hi], job.events)
                   if job.events else [])
    sim = Simulation(config, settings, job.policy, SliceView(workload, lo, hi), prepared.history, report,
                     future=workload, trained=trained, returns=job.returns, node_events=node_events)
    run = sim.run()
    bursts, floor = prepared.bursts, prepared.floor
    reusable, shared = floor.by_request_key(), floor.shared_by_request_key()
    summary = summarize(run.records, bursts, config.ttft_target_ms, run.replicas, config.real_bytes_per_block,
                        run.orders, reusable, config.profile, shared)
    draws = bootstrap_draws(run.records, bursts, config.ttft_target_ms, reusable, shared)
    cost = SimulatedRunFigures(wall_s=run.wall_s, cpu_s=run.cpu_s, simulated_events=run.events,
                               events_per_s=run.events / run.cpu_s if run.cpu_s else None, virtual_s=run.virtual_s,
                               network_bytes=run.network_bytes, peak_rss_mb=round(peak_rss_mb(), 1))
    return SimulationResult(
        nodes=job.nodes, policy=job.policy, seed=job.seed,
        summary=replace(summary, simulated=cost, actions=run.actions,
                        ci95=intervals_of(draws),
                        utilisation=utilisation(run.records, config.ttft_target_ms, list(run.lifetimes),
                                                run.lifetimes).to_json(),
                        events=[event_figures(run.records, e, reusable, shared)
                                .to_json() for e in run.node_events] if job.events else None),
        notes=notes,
        floor=floor_summary(floor.floor_ms, workload.times[lo:hi].tolist(), bursts, floor.returning),
        predictor=run.predictor, code="mypyc" if running_compiled() else "python",
        requests_in_slice=hi - lo, burst_seconds=len(bursts),
        slice=SliceSpec(start, (float(workload.times[hi - 1]) - start) if hi > lo else 0.0, job.speed),
        ttfts=[r.ttft_ms for r in run.records if r.served],
        arrivals=[(r.arrival_s, r.family) for r in run.records] if hi - lo <= 50_000 else [],
        timeline={"forecasts": run.forecasts, "forecast_horizon_s": settings.forecast_horizon_s,
                  "commits": [(t, b * config.real_bytes_per_block, f) for t, b, f in run.replicas.commits],
                  **({"node_load": _load_around_events(run)} if run.node_events else {})},
        cell=job.cell, draws=draws, disk_pages=job.disk_pages)


def _load_around_events(run: SimRun) -> dict[str, object]:
    """Per-node busy fraction per second from LOAD_WINDOW_S before the first
    node event to LOAD_WINDOW_S after the last (the report's load plot)."""
    first = int(math.floor(run.node_events[0].at_s)) - LOAD_WINDOW_S
    seconds = int(math.ceil(run.node_events[-1].at_s)) + LOAD_WINDOW_S - first
    series = busy_series(run.records, list(run.lifetimes), first, seconds)
    for node, (joined, left) in run.lifetimes.items():  # None where the node did not exist
        series[node] = [x if joined <= first + k < left else None for k, x in enumerate(series[node])]
    return {"first_s": first, "nodes": series, "events": [(e.kind, e.at_s, e.node) for e in run.node_events]}


@contextlib.contextmanager
def collection_for(job: Job):
    """Automatic collection as LIGHTGBM_GC_THRESHOLDS says: off unless the
    job's predictor runs LightGBM."""
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


def train_returns_once(args: argparse.Namespace, config: E2EConfig, first: Job, console) -> TrainedReturns | None:
    """The session-return model every forecast-reading simulation serves,
    trained here once on the base trace before the slice (returns.py); None
    with --returns off, when no policy reads forecasts, or when the trace
    before the slice is too short to train on."""
    if args.returns != "on" or not FORECAST_POLICIES.intersection(
            parse_variant(p).policy for p in args.policy_list):
        return None
    other = getattr(args, "returns_train_trace", None)
    if other:
        with console.status(f"training the session-return model on {Path(other).name}"):
            requests = load_base(Path(other), config)
            end = max((r.arrival_s for r in requests), default=0.0) + 1.0
            trained = train_returns(requests, end, f"{Path(other).name} (a different trace, whole)")
        console.print(f"session returns: {trained.description}" if trained else
                      f"session returns: none (fewer than {MIN_TRAINING_TURNS} turns in {other})")
        return trained
    with console.status("training the session-return model on the base trace before the slice"):
        base, _ = build_workload(replace(first, nodes=config.nodes), config)
        start = args.start_s if args.start_s is not None else float(base.times[0]) if len(base) else 0.0
        _, before = base.window(-math.inf, start)
        trained = train_returns([base[i] for i in range(before)], start, "the base trace")
    console.print(f"session returns: {trained.description}" if trained else
                  f"session returns: none (fewer than {MIN_TRAINING_TURNS} turns before the slice to train on)")
    return trained


def train_once(args: argparse.Namespace, config: E2EConfig, first: Job, console) -> TrainedPredictor | None:
    """The LightGBM model every worker serves, trained here once (each
    worker training on its merged history ran out of memory); None for the
    builtin predictor, or when none of the policies asked for reads forecasts."""
    if args.predictor != "lightgbm" or not FORECAST_POLICIES.intersection(
            parse_variant(p).policy for p in args.policy_list):
        return None
    if args.train_trace:
        with console.status(f"training LightGBM on {Path(args.train_trace).name}"):
            trained = train_on_other_trace(load_base(Path(args.train_trace), config), Path(args.train_trace).name)
    else:
        with console.status("training LightGBM on the base trace before the slice"):
            base, _ = build_workload(replace(first, nodes=config.nodes), config)
            start = args.start_s if args.start_s is not None else float(base.times[0]) if len(base) else 0.0
            trained = train_on_base(base, start, config.warmup_s)
    console.print(f"predictor: {trained.description}")
    return trained
