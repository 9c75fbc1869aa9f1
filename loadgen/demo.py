"""`speckv demo`: what speckv does, on one machine, in a few minutes.

On the one committed configuration (services/config/e2e.json), from just
before the workload's largest burst after the warm-up:

- the verdict (demo_verdict.py): every policy (--policies) in the
  deterministic simulator (loadgen/sim) over a window of VERDICT_S trace
  seconds holding several bursts, on each seed of the committed evaluation
  set (a synthetic workload) or on the one trace, each policy's burst p99
  against `none`'s with its 95 % interval (between seeds; on a trace, paired
  over the window's requests), the LightGBM predictor trained before the
  window and no session-return forecasts (the live cluster loads no return
  model);
- the live check: the first DEMO_SLICE_S of that window, replayed under the
  policies of --live (default `none` and `predictive`), each against a fresh
  local cluster of the real services with emulated engines
  (loadgen/bench/e2e/cli.py): the services at work, each figure with its 95 %
  bootstrap interval over the slice's requests, since a single live run on a
  shared machine moves by tens of percent; beside them every policy
  simulated on the same slice at the live replay's speed. A figure that
  ties `none`'s in the same kind of run is marked (simulated: the interval
  of the difference over the same requests holds 0; live: the intervals
  overlap). The live slice is short because a live run costs its cluster's
  start-up and real time; a simulation costs seconds of CPU.

The console prints the verdict's table once simulated (before the live
runs), then the live check's, each titled; the HTML report has both, the
charts and every figure.

`--engine vllm` runs the same demo on real engines: the live clusters are
vLLM OpenAI servers with SpeckvConnector (`speckv bench e2e --engine vllm`,
services/config/e2e_vllm.json), and the simulator runs the same scaled
requests on that configuration (its engine profile fitted to these engines,
their geometry), so the table sets the simulator beside the real engines;
the demo prints, per live policy, the simulated TTFT percentiles over the
live ones (experiments/sim_agreement.py). Its live policies take about five
minutes each (the engines start and compute the warm start's KV).

Workload: the Mooncake conversation trace in the traces directory
(--traces, else SPECKV_TRACES, else ../shared/traces). Without it the demo
runs on the synthetic workload DEFAULT_SCENARIO of
services/config/scenarios.json (tenants' long shared documents that burst:
the family burst of DESIGN.md) and says in one line how to use the trace.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

from speckv.loadgen.bench.e2e import cli as e2e
from speckv.loadgen.bench.e2e.engines import engine_setup
from speckv.loadgen.bench.e2e.run import PolicyRun
from speckv.loadgen.experiments.bootstrap import BootstrapDraws, bootstrap_draws, intervals_of, with_paired_intervals
from speckv.loadgen.demo_verdict import (
    VERDICT_S,
    DemoVerdict,
    PendingVerdict,
    evaluation_seeds,
    verdict_table,
    verdict_window,
)
from speckv.loadgen.experiments.demo_report import (
    DEMO_LEGEND,
    LIVE_CHECK,
    LIVE_RUN,
    SIMULATED_RUN,
    VerdictView,
    demo_table,
    verdict_console_table,
    write_demo_report,
)
from speckv.loadgen.experiments.e2e_config import E2EConfig, SliceSpec, load_e2e_config
from speckv.loadgen.experiments.report import BASELINE
from speckv.loadgen.experiments.metrics import burst_runs, burst_seconds, summarize
from speckv.loadgen.experiments.sim_agreement import agreement
from speckv.loadgen.experiments.results import (
    Comparison,
    PolicySummary,
    SimulatedRunFigures,
    with_avoidable_closed,
)
from speckv.loadgen.experiments.ttft_floor import floor_summary, slice_floor
from speckv.loadgen.sim.machine import peak_rss_mb
from speckv.loadgen.sim.predictor import TrainedPredictor, train_lightgbm
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import SimRun, Simulation
from speckv.loadgen.workload.scenarios import get_scenario
from speckv.services.cluster.status import wide_console
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.traces import TraceRequest, load_mooncake
from speckv.services.common.traces.records import DEFAULT_TRACES_DIR
from speckv.services.scheduler.policies.registry import FORECAST_POLICIES

DEFAULT_TRACE = "mooncake_conversation_trace.jsonl"
# Its long shared prefixes (a document per tenant) and their bursts are the
# family burst speckv is built for; the other scenarios are for `simulate`.
DEFAULT_SCENARIO = "document-bursts"
SCENARIO_SEED = 7  # `speckv simulate --seed`'s default: the same workload there
DEFAULT_LIVE = "none,predictive"
# Trace seconds replayed. Each live policy costs its cluster's start budget
# plus this / speed of replay plus the drain; the demo's time is mostly that,
# once per live policy (docs/performance.md, "Demo").
DEMO_SLICE_S = 30.0
# The slice starts this long before its burst's first second, so a policy
# that acts ahead of a burst has time to, and the burst lands mid-slice.
LEAD_S = 5.0


@dataclass(frozen=True, slots=True)
class DemoWorkload:
    """What the demo runs on: the whole workload, in arrival order."""

    name: str  # what the tables call it: the trace file's name, or "synthetic:<scenario>"
    requests: list[TraceRequest]
    synthetic: bool
    hint: str | None  # the one line saying how to run on the public trace; None when it does
    reproduce: str  # the `speckv simulate` flags naming the same workload
    source: str  # the trace file's path, or the scenario's name when synthetic


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speckv demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=None, help="traces directory [env SPECKV_TRACES; ../shared/traces]")
    parser.add_argument("--trace", default=DEFAULT_TRACE, help="Mooncake JSONL file in the traces directory")
    parser.add_argument("--scenario", default=DEFAULT_SCENARIO,
                        help="synthetic workload (services/config/scenarios.json) when the trace is absent")
    parser.add_argument("--policies", default=e2e.ALL_POLICIES,
                        help="policies of the verdict, simulated over the window (comma-separated)")
    parser.add_argument("--live", default=DEFAULT_LIVE,
                        help="policies of the live check: each replays the slice on a fresh local cluster and is "
                             "simulated on it beside (comma-separated; each adds about a minute)")
    parser.add_argument("--start-s", type=float, default=None,
                        help="slice start, trace s (default: just before the largest burst after the warm-up)")
    parser.add_argument("--duration-s", type=float, default=DEMO_SLICE_S, help="live slice length, trace s")
    parser.add_argument("--verdict-s", type=float, default=VERDICT_S,
                        help="the verdict window's length, trace s, from the slice's start")
    parser.add_argument("--report", default=None, help="report directory [default: <run dir>/report]")
    parser.add_argument("--json", default=None, help="write the result JSON here")
    parser.add_argument("--engine", choices=("emulated", "vllm"), default="emulated",
                        help="vllm: the live runs on real vLLM servers (and the simulator on their profile)")
    parser.add_argument("--model", type=Path, default=None,
                        help="with --engine vllm: the engines' local model directory (default: the tiny Llama)")
    args = parser.parse_args(list(argv))
    if args.model is not None and args.engine != "vllm":
        raise InvalidArgument("--model names the vllm engines' model: give --engine vllm too")
    args.policy_list = _policy_list(args.policies, "--policies")
    args.live_list = _policy_list(args.live, "--live")
    if args.duration_s <= 0 or args.verdict_s <= 0:
        raise InvalidArgument(f"--duration-s={args.duration_s:g}, --verdict-s={args.verdict_s:g}: must be > 0")
    return args


def _policy_list(text: str, flag: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names or len(set(names)) != len(names):
        raise InvalidArgument(f"{flag}={text!r}: name each policy once")
    return names


def choose_workload(traces: str | None, trace_file: str, scenario: str, environ: Mapping[str, str],
                    config: E2EConfig) -> DemoWorkload:
    """The trace `trace_file` in the traces directory (traces, else
    SPECKV_TRACES, else ../shared/traces), keyed into the config's families,
    when that file exists; otherwise (no such directory, an empty one, or no
    such file in it) the synthetic `scenario`, with a hint naming the path
    looked at and where the public trace comes from."""
    directory = Path(traces or environ.get("SPECKV_TRACES") or DEFAULT_TRACES_DIR)
    path = directory / trace_file
    if path.is_file():
        return DemoWorkload(path.name, load_mooncake(path, family=config.family), False, None,
                            f"--trace {path}", str(path))
    workload = get_scenario(scenario, SCENARIO_SEED, config.block_tokens)
    hint = (f"No trace file {path}: running on the synthetic workload '{scenario}' instead. For the public "
            f"Mooncake trace, save FAST25-release/traces/conversation_trace.jsonl of github.com/kvcache-ai/Mooncake "
            f"as {path}, or pass --traces DIR (README.md, \"Traces\").")
    return DemoWorkload(f"synthetic:{scenario}", workload.requests(), True, hint,
                        f"--synthetic {scenario} --seed {SCENARIO_SEED}", scenario)


def demo_slice(requests: Sequence[TraceRequest], warmup_s: float, duration_s: float, speed: float,
               start_s: float | None = None) -> SliceSpec:
    """duration_s of trace (replayed speed x faster) from start_s, or by
    default from LEAD_S before the first second of the workload's largest
    burst (the most arrivals; the earliest of equals) among those beginning
    in the second warmup_s of the workload: the warm start and the
    predictor's training read the warmup_s before the slice, so the first
    warmup_s cannot be in it. Without a burst there, the slice starts as
    soon as that history allows. InvalidArgument when the workload ends
    before the slice does or holds no request in it."""
    if not requests:
        raise InvalidArgument("the workload holds no request")
    first = math.floor(requests[0].arrival_s)
    if start_s is None:
        seconds = [math.floor(r.arrival_s) for r in requests]
        counts: dict[int, int] = {}
        for s in seconds:
            counts[s] = counts.get(s, 0) + 1
        lo, hi = first + warmup_s + LEAD_S, first + 2 * warmup_s
        candidates = [(sum(counts.get(s, 0) for s in range(a, b + 1)), a)
                      for a, b in burst_runs(burst_seconds(r.arrival_s for r in requests)) if lo <= a < hi]
        start_s = (max(candidates, key=lambda c: (c[0], -c[1]))[1] - LEAD_S) if candidates else first + warmup_s
    if requests[-1].arrival_s < start_s + duration_s:
        raise InvalidArgument(f"the workload ends at {requests[-1].arrival_s:g} s, before the slice "
                              f"[{start_s:g}, {start_s + duration_s:g}) s does")
    if not any(start_s <= r.arrival_s < start_s + duration_s for r in requests):
        raise InvalidArgument(f"the slice [{start_s:g}, {start_s + duration_s:g}) s holds no request")
    return SliceSpec(float(start_s), duration_s, speed)


def simulate(workload: DemoWorkload, policies: Sequence[str], config: E2EConfig, slice_: SliceSpec,
             console) -> tuple[Comparison, dict[str, SimRun], TrainedPredictor | None]:
    """Every policy on the slice in the simulator, as the live comparison
    runs it: the config's warm start and node count, intervals stretched by
    the replay's speed (SimSettings.from_e2e), LightGBM trained once on the
    warmup_s before the slice for the policies that read forecasts. Each
    summary carries its 95 % bootstrap intervals (ci95), and each but
    none's the paired interval of its difference from none's (ci95_vs_none).
    Also returns the LightGBM model (None when no policy reads forecasts)."""
    began = time.perf_counter()
    requests = workload.requests
    end = slice_.start_s + slice_.duration_s
    in_slice = [r for r in requests if slice_.start_s <= r.arrival_s < end]
    history = [r for r in requests if slice_.start_s - config.warmup_s <= r.arrival_s < slice_.start_s]
    bursts = burst_seconds(r.arrival_s for r in requests)
    trained = None
    if FORECAST_POLICIES.intersection(policies):
        with e2e.quiet_lightgbm_training():
            trained = train_lightgbm(history, workload.name)
    settings = SimSettings.from_e2e(config, speed=slice_.speed, predictor="lightgbm")
    floor = slice_floor([r for r in requests if r.arrival_s < slice_.start_s], in_slice, config.profile)
    reusable, shared = floor.by_request_key(), floor.shared_by_request_key()
    runs: dict[str, SimRun] = {}
    summaries: dict[str, PolicySummary] = {}
    draws: dict[str, BootstrapDraws] = {}
    for policy in policies:
        run = runs[policy] = Simulation(config, settings, policy, in_slice, history, trained=trained).run()
        summary = summarize(run.records, bursts, config.ttft_target_ms, run.replicas, config.real_bytes_per_block,
                            run.orders, reusable, config.profile, shared)
        cost = SimulatedRunFigures(wall_s=run.wall_s, cpu_s=run.cpu_s, simulated_events=run.events,
                                   events_per_s=run.events / run.cpu_s if run.cpu_s else None,
                                   virtual_s=run.virtual_s, network_bytes=run.network_bytes,
                                   peak_rss_mb=round(peak_rss_mb(), 1))
        draws[policy] = bootstrap_draws(run.records, bursts, config.ttft_target_ms, reusable, shared)
        summaries[policy] = replace(summary, simulated=cost, actions=run.actions, ci95=intervals_of(draws[policy]))
    summaries = with_paired_intervals(summaries, draws)
    floor_row = floor_summary(floor.floor_ms, [r.arrival_s for r in in_slice], bursts, floor.returning)
    predictor = trained.description if trained is not None else "not run (no policy here reads forecasts)"
    command = (f"speckv simulate {workload.reproduce} --nodes {config.nodes} --start-s {slice_.start_s:g} "
               f"--duration-s {slice_.duration_s:g} --speed {slice_.speed:g} --predictor lightgbm --returns off")
    notes = [f"Simulated in virtual time (loadgen/sim), as `{command}` runs it: the live configuration, its warm "
             f"start and its intervals in trace seconds at speed {slice_.speed:g}; bytes are the real model's.",
             f"Predictor: {predictor}; run only for the policies that read forecasts "
             f"({', '.join(sorted(FORECAST_POLICIES))}). No session-return forecasts: the demo's live cluster "
             "loads no return model.",
             "Deterministic: the same slice gives the same figures on any machine. Their 95 % bootstrap intervals "
             "over the slice's requests (ci95) say whether the slice holds enough requests to tell two policies "
             "apart; the verdict against none reads the interval of the difference itself, drawn over the same "
             "requests for both (ci95_vs_none): a difference whose interval holds 0 is a tie."]
    console.print(f"live check: {len(policies)} policies simulated on the live slice in "
                  f"{time.perf_counter() - began:.1f} s", markup=False, highlight=False)
    comparison = Comparison(
        trace=workload.name, slice=slice_, ttft_target_ms=config.ttft_target_ms, byte_scale_factor=1,
        nodes=config.nodes, engine_profile=config.profile.name, link_gbps=config.link.gbps,
        real_bytes_per_block=config.real_bytes_per_block, burst_seconds_in_trace=len(bursts),
        policies=with_avoidable_closed(summaries, floor_row), floor=floor_row, notes=notes,
        host_pages=config.host_pages)
    return comparison, runs, trained


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    args = parse_args(argv)
    console = wide_console()
    config = load_e2e_config(e2e.VLLM_CONFIG if args.engine == "vllm" else None)
    workload = choose_workload(args.traces, args.trace, args.scenario, environ, config)
    if workload.hint:
        console.print(workload.hint, markup=False, highlight=False, soft_wrap=True)
    if workload.synthetic and "oracle" in args.live_list:
        raise InvalidArgument("--live oracle: the live oracle reads its future from a Mooncake trace file, keyed "
                              "as the configuration says; on a synthetic workload it is simulated only")
    slice_ = demo_slice(workload.requests, config.warmup_s, args.duration_s, config.slices["quick"].speed,
                        args.start_s)
    logger = logging.getLogger("speckv")
    level = logger.level
    if "SPECKV_LOG_LEVEL" not in environ:
        # The console is the demo's progress and its table; the client's INFO
        # lines (a pull that lost a race with an eviction, ...) would break
        # into the progress bars. SPECKV_LOG_LEVEL=INFO brings them back.
        logger.setLevel(logging.WARNING)
    try:
        return _run(args, console, config, workload, slice_, environ)
    finally:
        logger.setLevel(level)


def _run(args: argparse.Namespace, console, config: E2EConfig, workload: DemoWorkload, slice_: SliceSpec,
         environ: Mapping[str, str]) -> int:
    """Simulates, replays live, prints the table and writes the report; 1 when a run served nothing."""
    window = verdict_window(workload.requests, slice_, args.verdict_s)
    seeds = f"seeds {', '.join(map(str, evaluation_seeds()))}" if workload.synthetic else "the trace"
    console.print(f"speckv demo on {workload.name}: the verdict simulates {len(args.policy_list)} policies over trace "
                  f"seconds [{window.start_s:g}, {window.start_s + window.duration_s:g}) on {seeds}; the live check "
                  f"replays its first {slice_.duration_s:g} s under {', '.join(args.live_list)} on {args.engine} "
                  f"engines, {config.nodes} nodes", markup=False, highlight=False)
    setup = engine_setup(config, args.engine, args.model)
    # The verdict runs on the committed configuration (services/config/e2e.json, whatever --engine) and the
    # workload as it is; its other realizations simulate in worker processes while the live check's
    # simulations run here.
    pending = PendingVerdict(workload.name, workload.source, workload.synthetic, args.policy_list,
                             load_e2e_config().nodes, window)
    try:
        sim_workload, sim_config = workload, config
        if setup.kind == "vllm":  # the simulator runs what the real engines run: the scaled requests, their geometry
            end = slice_.start_s + slice_.duration_s
            sim_workload = replace(workload, requests=setup.scale([r for r in workload.requests if r.arrival_s < end]))
            sim_config = replace(config, real_geometry=setup.geometry, block_tokens=setup.geometry.block_size)
        simulated, sim_runs, trained = simulate(sim_workload, args.live_list, sim_config, slice_, console)
        # On vllm engines the slice's model was trained on scaled requests: the window trains its own.
        verdict = pending.finish(console, trained if setup.kind != "vllm" else None)
    finally:
        pending.close()
    # The verdict first: it is ready in seconds, and a live cluster that fails to start does not lose it.
    view = _verdict_view(verdict)
    console.print(view.heading, markup=False, highlight=False, soft_wrap=True)
    console.print(verdict_console_table(view))
    console.print(view.legend, markup=False, highlight=False, soft_wrap=True)
    live, live_runs = e2e.compare_requests(workload.name, workload.requests, args.live_list, config, slice_,
                                           environ, console, quick=True, setup=setup)
    agreements = [agreement(p, live_runs[p].records, sim_runs[p].records) for p in args.live_list if p in sim_runs]
    if setup.kind == "vllm":
        console.print("simulator against the real engines (TTFT):\n" + "\n".join(a.line() for a in agreements),
                      markup=False, highlight=False)
    in_slice = [r for r in workload.requests if slice_.start_s <= r.arrival_s < slice_.start_s + slice_.duration_s]
    title = (f"{LIVE_CHECK}: {workload.name}, trace seconds [{slice_.start_s:g}, "
             f"{slice_.start_s + slice_.duration_s:g}), {len(in_slice)} requests, {config.nodes} nodes, simulated "
             f"and live " + ("(TTFT in ms of the real vLLM engines on this CPU; the simulator's on their fitted "
                             "profile)" if setup.kind == "vllm" else "(TTFT in ms of the real model)"))
    table = demo_table(title, simulated.policies, live.policies, simulated.floor)
    console.print(table)
    console.print(DEMO_LEGEND, markup=False, highlight=False, width=max(80, console.measure(table).maximum))
    extra = {"workload": {"name": workload.name, "synthetic": workload.synthetic, "slice": asdict(slice_),
                          "verdict_window": asdict(window)}}
    if args.json:
        data = {**extra, "engine": setup.kind, "verdict": verdict.to_json(), "simulated": simulated.to_json(),
                "live": live.to_json(), "sim_vs_live": [a.to_json() for a in agreements]}
        Path(args.json).write_text(json.dumps(data, indent=2))
        console.print(f"JSON written to {args.json}", markup=False, highlight=False)
    report = Path(args.report or Path(environ.get("SPECKV_RUN_DIR") or f"/tmp/speckv-{os.getuid()}") / "report")
    index = write_demo_report(report, _heading(workload, slice_, window, len(in_slice), config, args), view,
                              simulated, live, _ttfts(sim_runs, live_runs),
                              _timelines(sim_runs, live_runs, sim_config.real_bytes_per_block,
                                         live.real_bytes_per_block, config.forecast_horizon_s * slice_.speed),
                              {**extra, "verdict": verdict.to_json()})
    console.print(f"report: {index}", markup=False, highlight=False, soft_wrap=True)
    served = [m.served for m in (*simulated.policies.values(), *live.policies.values())]
    return 1 if any(s == 0 for s in served) else 0


def _heading(workload: DemoWorkload, slice_: SliceSpec, window: SliceSpec, requests: int, config: E2EConfig,
             args: argparse.Namespace) -> str:
    what = (f"the synthetic workload '{args.scenario}' of services/config/scenarios.json (no trace file was found)"
            if workload.synthetic else f"the Mooncake conversation trace ({workload.name})")
    where = "" if args.start_s is not None else ", from just before its largest burst after the warm-up"
    return (f"On {what}, {config.nodes} nodes{where}. The verdict: {len(args.policy_list)} policies simulated over "
            f"trace seconds [{window.start_s:g}, {window.start_s + window.duration_s:g}). The live check: its first "
            f"{slice_.duration_s:g} s, [{slice_.start_s:g}, {slice_.start_s + slice_.duration_s:g}), {requests} "
            f"requests, simulated again at the live replay's speed and replayed live, {slice_.speed:g}x faster, "
            f"under {', '.join(args.live_list)}. TTFT in ms of the real model (engine profile "
            f"{config.profile.name}).")


def _verdict_view(verdict: DemoVerdict) -> VerdictView:
    """The verdict as the console and the report show it; the timeline is
    the first realization's window, where families bring several requests."""
    titles, rows = verdict_table(verdict)
    first = verdict.runs[0]
    legend = (f"Simulated (loadgen/sim), deterministic: `{verdict.command}` gives the same figures. "
              f"Predictor: {verdict.predictor}"
              + (f" (seed {verdict.seeds[0]}'s; each seed's model is trained on its own warm-up before the window)"
                 if len(verdict.seeds) > 1 else "")
              + f". A verdict is 'tie' when the {verdict.interval} of the difference "
              f"from {BASELINE} holds 0.")
    labels = [f"seed {r.seed}" for r in verdict.runs if r.seed is not None] or [verdict.workload]
    return VerdictView(verdict.headline(), titles, rows, legend, first.timelines, first.arrivals, labels[0], labels,
                       {v.policy: v.burst_p99_ms for v in verdict.policies})


def _ttfts(sim: Mapping[str, SimRun], live: Mapping[str, PolicyRun]) -> dict[str, dict[str, list[float]]]:
    return {SIMULATED_RUN: {p: [r.ttft_ms for r in run.records if r.served] for p, run in sim.items()},
            LIVE_RUN: {p: [r.ttft_ms for r in run.records if r.served] for p, run in live.items()}}


def _timelines(sim: Mapping[str, SimRun], live: Mapping[str, PolicyRun], sim_bytes_per_block: int,
               live_bytes_per_block: int, horizon_s: float) -> dict[str, dict[str, dict[str, object]]]:
    """Per run and policy: forecasts (trace s, family, count within
    horizon_s trace s: the predictor's horizon at the replay's speed, in
    both runs) and commits (trace s, real bytes, family), as write_report
    draws them."""
    def line(forecasts, commits, per_block: int) -> dict[str, object]:
        return {"forecasts": forecasts, "forecast_horizon_s": horizon_s,
                "commits": [(t, blocks * per_block, f) for t, blocks, f in commits]}

    return {SIMULATED_RUN: {p: line(run.forecasts, run.replicas.commits, sim_bytes_per_block)
                            for p, run in sim.items()},
            LIVE_RUN: {p: line(run.forecasts, run.replicas.commits, live_bytes_per_block)
                       for p, run in live.items()}}
