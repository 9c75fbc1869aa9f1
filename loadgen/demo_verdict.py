"""The demo's verdict: every policy simulated over a window holding several
bursts, on each seed of the committed evaluation set (a synthetic workload)
or on the one trace, each policy compared with `none` on the same
realization.

The live replay's cost is the cluster's start-up and real time, so the live
slice stays short (demo.DEMO_SLICE_S, one burst); the simulator's cost is
CPU, a few seconds a policy, so the verdict reads a window VERDICT_S trace
seconds long that begins where the live slice does (LEAD_S before the
largest burst after the warm-up, found by metrics.burst_runs) and so holds
the live slice and the bursts after it. It runs at the workload's own speed
(speed 1: the services' intervals as deployed, not stretched for a faster
replay). Each simulation is the one `speckv simulate` makes of that window
(jobs.run_prepared, the same code, the LightGBM model trained on the
warm-up before the window, no session-return forecasts since the live
cluster loads none); DemoVerdict.command reproduces every figure.

- Synthetic: each seed of the scenarios file's "evaluation" set
  (services/config/scenarios.json) is one realization of the workload, the
  same window in each. A policy's verdict reads the 95 % Welch interval of
  the difference of its mean burst p99 over the seeds from none's
  (repeats.py): "tie" when it holds 0, else "better" or "worse".
- Trace: one realization; the verdict reads the paired bootstrap interval of
  the difference over the window's requests (ci95_vs_none), as `speckv
  simulate` on a trace does.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import time
import warnings
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from speckv.loadgen.experiments.bootstrap import with_paired_intervals
from speckv.loadgen.experiments.demo_report import VERDICT_TITLE
from speckv.loadgen.experiments.e2e_config import SliceSpec
from speckv.loadgen.experiments.metrics import burst_runs
from speckv.loadgen.experiments.repeats import RepeatDifference, mean_difference
from speckv.loadgen.experiments.report import BASELINE, VERDICT_FIGURE
from speckv.loadgen.experiments.results import PolicySummary
from speckv.loadgen.sim.jobs import Job, SimulationResult, collection_for, prepare, run_prepared
from speckv.loadgen.sim.parent_watch import exit_with_parent
from speckv.loadgen.sim.pool import worker_environment
from speckv.loadgen.sim.predictor import TrainedPredictor, train_on_base
from speckv.loadgen.workload.scenarios import seed_sets
from speckv.services.common.traces import TraceRequest
from speckv.services.scheduler.policies.registry import FORECAST_POLICIES

# Trace seconds of the verdict window: six live slices, holding the live
# slice's burst and those of the next three minutes (the conversation trace
# and document-bursts hold one every 30-60 s), at a few seconds of CPU per
# policy and seed.
VERDICT_S = 180.0
# The named seed set (scenarios.json "seeds") a synthetic verdict reads.
EVALUATION_SET = "evaluation"
SIMULATED_SPEED = 1.0
# Realizations simulated in worker processes at once (the demo's machine has 2 cores).
MAX_WORKERS = 2


@dataclass(frozen=True, slots=True)
class SeedRun:
    """Every policy on one realization (seed None: the trace) of the window."""

    seed: int | None
    bursts: int  # burst runs (metrics.burst_runs) beginning in the window
    requests: int
    summaries: dict[str, PolicySummary]  # with ci95 and, but none's, ci95_vs_none
    timelines: dict[str, dict[str, object]]  # per policy, as the report's timeline draws them
    arrivals: list[tuple[float, str]]  # (trace s, family) of the window's requests


@dataclass(frozen=True, slots=True)
class PolicyVerdict:
    """One policy's burst p99 against none's over the realizations."""

    policy: str
    burst_p99_ms: list[float | None]  # per realization, in the runs' order
    gib_replicated: float  # mean over the realizations
    mean_ms: float | None
    difference_ms: float | None  # mean - none's mean
    low_ms: float | None  # the 95 % interval of the difference
    high_ms: float | None
    verdict: str  # "baseline", "better", "worse", "tie", or "-" (nothing to judge)


@dataclass(frozen=True, slots=True)
class DemoVerdict:
    workload: str  # "synthetic:<scenario>" or the trace file's name
    window: SliceSpec
    nodes: int
    seeds: list[int]  # the evaluation seeds; empty for a trace
    runs: list[SeedRun]
    policies: list[PolicyVerdict]
    command: str  # the `speckv simulate` command reproducing every figure
    predictor: str

    @property
    def interval(self) -> str:
        """What the verdict's interval is over."""
        return ("95 % Welch interval between seeds" if self.seeds else
                "95 % paired bootstrap interval over the window's requests")

    def headline(self) -> str:
        realizations = (f"seeds {', '.join(map(str, self.seeds))} (services/config/scenarios.json, "
                        f"'{EVALUATION_SET}')" if self.seeds else "the one trace (no seeds: it has one realization)")
        bursts = " / ".join(str(r.bursts) for r in self.runs)
        return (f"{VERDICT_TITLE}: {self.workload}, trace seconds [{self.window.start_s:g}, "
                f"{self.window.start_s + self.window.duration_s:g}), {self.nodes} nodes, {realizations}; bursts in "
                f"the window: {bursts}{' per seed' if self.seeds else ''}; burst p99 against {BASELINE}, "
                f"{self.interval}.")

    def to_json(self) -> dict[str, object]:
        return {"workload": self.workload, "window": {"start_s": self.window.start_s,
                                                      "duration_s": self.window.duration_s,
                                                      "speed": self.window.speed},
                "nodes": self.nodes, "seeds": self.seeds, "interval": self.interval, "command": self.command,
                "predictor": self.predictor,
                "runs": [{"seed": r.seed, "bursts": r.bursts, "requests": r.requests,
                          "policies": {p: s.to_json() for p, s in r.summaries.items()}} for r in self.runs],
                "verdicts": [{"policy": v.policy, "burst_ttft_p99_ms": v.burst_p99_ms, "mean_ms": v.mean_ms,
                              "difference_ms": v.difference_ms, "interval_ms": [v.low_ms, v.high_ms],
                              "gib_replicated": v.gib_replicated, "verdict": v.verdict} for v in self.policies]}


def verdict_window(requests: Sequence[TraceRequest], live: SliceSpec, duration_s: float = VERDICT_S) -> SliceSpec:
    """duration_s trace seconds from the live slice's start (never shorter
    than the live slice, never past the workload's last arrival), at speed 1."""
    last = requests[-1].arrival_s if requests else live.start_s
    return SliceSpec(live.start_s, max(live.duration_s, min(duration_s, last - live.start_s)), SIMULATED_SPEED)


def bursts_in(bursts: frozenset[int], window: SliceSpec) -> int:
    """The bursts (burst_runs of the workload's burst seconds) that begin in the window."""
    return sum(1 for first, _ in burst_runs(bursts) if window.start_s <= first < window.start_s + window.duration_s)


def evaluation_seeds() -> list[int]:
    return seed_sets()[EVALUATION_SET]


class PendingVerdict:
    """The verdict under way: constructing it submits every realization but
    the first to worker processes (spawned, one per realization, at most
    MAX_WORKERS at once), so they simulate while the caller does other CPU
    work (the live check's simulations); finish() runs the first
    realization in this process, with the caller's model when it has one,
    and gathers the rest. Deterministic: where a realization runs does not
    change its figures."""

    def __init__(self, workload: str, source: str, synthetic: bool, policies: Sequence[str], nodes: int,
                 window: SliceSpec) -> None:
        self.workload, self.source, self.synthetic = workload, source, synthetic
        self.policies, self.nodes, self.window = list(policies), nodes, window
        self.seeds: list[int | None] = list(evaluation_seeds()) if synthetic else [None]
        self._began = time.perf_counter()
        self._pool: ProcessPoolExecutor | None = None
        self._futures: dict[int | None, Future] = {}
        rest = self.seeds[1:]
        if rest:
            ctx = multiprocessing.get_context("spawn")
            with worker_environment(None, 1, os.environ):
                self._pool = ProcessPoolExecutor(max_workers=min(MAX_WORKERS, len(rest)), mp_context=ctx,
                                                 initializer=exit_with_parent, initargs=(os.getpid(),))
                self._futures = {seed: self._pool.submit(_run_seed, source, synthetic, seed, self.policies, nodes,
                                                         window, None) for seed in rest}

    def finish(self, console, trained_first: TrainedPredictor | None = None) -> DemoVerdict:
        """The verdict. trained_first: the first realization's LightGBM
        model when the caller has it (trained on the same warm-up), else
        trained here."""
        try:
            began = time.perf_counter()
            first, predictor = _run_seed(self.source, self.synthetic, self.seeds[0], self.policies, self.nodes,
                                         self.window, trained_first)
            _progress(console, first, len(self.policies), time.perf_counter() - began, "")
            runs = [first]
            for seed, future in self._futures.items():
                run, described = future.result()
                predictor = predictor or described
                runs.append(run)
                _progress(console, run, len(self.policies), time.perf_counter() - self._began,
                          ", in a worker process started with the demo")
        finally:
            self.close()
        spec = f"--synthetic {self.source} --seeds {EVALUATION_SET}" if self.synthetic else f"--trace {self.source}"
        command = (f"speckv simulate {spec} --nodes {self.nodes} --policies {','.join(self.policies)} --start-s "
                   f"{self.window.start_s:g} --duration-s {self.window.duration_s:g} --predictor lightgbm "
                   "--returns off")
        return DemoVerdict(self.workload, self.window, self.nodes, [s for s in self.seeds if s is not None], runs,
                           judge(runs, self.policies), command,
                           predictor or "not run (no policy here reads forecasts)")

    def close(self) -> None:
        """Ends the workers (idempotent): on an error before finish, the
        realizations still simulating are not waited for."""
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        running = [f for f in self._futures.values() if not f.done()]
        if running:
            for process in list(getattr(pool, "_processes", {}).values()):  # no public way to stop a running task
                process.terminate()
        pool.shutdown(wait=not running, cancel_futures=True)


def _progress(console, run: SeedRun, policies: int, seconds: float, where: str) -> None:
    console.print(f"verdict window{'' if run.seed is None else f', seed {run.seed}'}: {policies} policies simulated "
                  f"in {seconds:.1f} s{where} ({run.bursts} bursts, {run.requests} requests)",
                  markup=False, highlight=False)


def _run_seed(source: str, synthetic: bool, seed: int | None, policies: Sequence[str], nodes: int,
              window: SliceSpec, trained: TrainedPredictor | None) -> tuple[SeedRun, str | None]:
    """Every policy on one realization; also the model's description (None: no model)."""
    base = Job(source, seed if seed is not None else 7, nodes, policies[0], window.start_s, window.duration_s,
               "lightgbm", window.speed, None, synthetic=synthetic)
    prepared = prepare(base)
    if trained is None and FORECAST_POLICIES.intersection(policies):
        with warnings.catch_warnings():
            # As bench/e2e/cli.py's quiet_lightgbm_training (not imported: the workers would load the bench):
            # the validation set's reference= is on purpose, LightGBM's warning about it is noise.
            warnings.filterwarnings("ignore", message="Overriding the parameters from Reference Dataset",
                                    category=UserWarning, module=r"lightgbm(\.|$)")
            trained = train_on_base(prepared.workload, window.start_s, prepared.config.warmup_s)
    results: list[SimulationResult] = []
    for policy in policies:
        job = replace(base, policy=policy, trained=trained)
        with collection_for(job):
            results.append(run_prepared(job, prepared))
    summaries = with_paired_intervals({r.policy: r.summary for r in results},
                                      {r.policy: r.draws for r in results if r.draws is not None})
    first = results[0]
    run = SeedRun(seed, bursts_in(prepared.bursts, window), first.requests_in_slice, summaries,
                  {r.policy: r.timeline for r in results}, first.arrivals)
    return run, trained.description if trained is not None else None


def judge(runs: Sequence[SeedRun], policies: list[str]) -> list[PolicyVerdict]:
    """Per policy, its burst p99 against none's (the module docstring says how)."""
    out = []
    for policy in policies:
        values = [_figure(r.summaries.get(policy)) for r in runs]
        gib = float(np.mean([(r.summaries[policy].bytes_replicated or 0) / 2**30 for r in runs
                             if policy in r.summaries]))
        base = [_figure(r.summaries.get(BASELINE)) for r in runs]
        kept = [(v, b) for v, b in zip(values, base) if v is not None and b is not None]
        if policy == BASELINE or not kept:
            mean = float(np.mean([v for v in values if v is not None])) if any(v is not None for v in values) else None
            out.append(PolicyVerdict(policy, values, gib, mean, None, None, None,
                                     "baseline" if policy == BASELINE else "-"))
            continue
        mine, theirs = [v for v, _ in kept], [b for _, b in kept]
        mean, base_mean = float(np.mean(mine)), float(np.mean(theirs))
        interval = mean_difference(mine, theirs) if len(runs) > 1 else _paired(runs[0].summaries[policy])
        if interval is None:
            out.append(PolicyVerdict(policy, values, gib, mean, mean - base_mean, None, None, "-"))
            continue
        verdict = RepeatDifference(VERDICT_FIGURE, policy, len(mine), base_mean, mean, *interval).verdict
        out.append(PolicyVerdict(policy, values, gib, mean, mean - base_mean, interval[0], interval[1], verdict))
    return out


def _figure(summary: PolicySummary | None) -> float | None:
    value = getattr(summary, VERDICT_FIGURE, None) if summary is not None else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _paired(summary: PolicySummary) -> tuple[float, float] | None:
    interval = (summary.ci95_vs_none or {}).get(VERDICT_FIGURE)
    return (float(interval[0]), float(interval[1])) if interval is not None else None


def verdict_table(verdict: DemoVerdict) -> tuple[list[str], list[list[str]]]:
    """The verdict as (column titles, rows of text): the console, Markdown
    and HTML renderings all show these."""
    per_run = [f"seed {s}" for s in verdict.seeds] if verdict.seeds else ["burst p99 ms"]
    titles = ["policy", *[f"{t} burst p99 ms" if verdict.seeds else t for t in per_run],
              *(["mean ms"] if verdict.seeds else []), f"vs {BASELINE} ms", "95 % interval", "verdict",
              "GiB replicated" + (" (mean)" if verdict.seeds else "")]
    rows = []
    for v in verdict.policies:
        cells = [v.policy, *[_ms(x) for x in v.burst_p99_ms]]
        if verdict.seeds:
            cells.append(_ms(v.mean_ms))
        change = "" if v.difference_ms is None or v.mean_ms is None else (
            f"{v.difference_ms:+.0f} ({v.difference_ms / (v.mean_ms - v.difference_ms):+.0%})"
            if v.mean_ms != v.difference_ms else f"{v.difference_ms:+.0f}")
        interval = "" if v.low_ms is None else f"[{v.low_ms:+.0f}, {v.high_ms:+.0f}]"
        rows.append([*cells, change, interval, v.verdict, f"{v.gib_replicated:.1f}"])
    return titles, rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
