"""`speckv bench e2e`: the same trace slice under each policy, each against a
freshly started local cluster built from the one committed configuration
(services/config/e2e.json), with emulated engines, the reference router and
open-loop replay. Prints a table per policy and writes JSON (--json) and an
HTML report (--report DIR). Each policy's latency and SLO figures carry 95 %
bootstrap intervals over the slice's requests (bootstrap.bootstrap_intervals:
`ci95` in the JSON, whiskers in the report).

Before the policies run, the predictor's LightGBM model is trained once on
the `warmup_s` of trace before the slice (e2e/model.py) and every policy's
predictor loads it; each fresh cluster is warm-started with that same
pre-slice trace (e2e/warm.py). Requests are keyed into families as the
config says (`model.family`, the conversation for the Mooncake trace).

`--engine torch` replaces the emulated engines with a small real PyTorch
decoder on the CPU whose KV (real bytes, scale 1) goes through the kvstores
(e2e/engines.py says what changes with it, and the result's notes repeat it).
`--engine vllm` runs real vLLM OpenAI servers, one per node, whose
SpeckvConnector reads and writes the node's kvstore, with a cluster of its
own (services/config/e2e_vllm.json; e2e/vllm_engines.py says what changes).

`--events NAME` plays a node event set (services/config/events.json, or
--events-file) during each policy's replay: kills SIGKILL a node's kvstore
and engine, adds start a node that registers with the running scheduler
(e2e/events.py); the router re-sends what a dead node took down, at most
--migration-limit times a request. Each policy's JSON then carries
`events` (event_metrics.py) beside `utilisation` (utilisation.py), which
every run reports.

`--repeats N` replays the slice N times per policy, round-robin over the
policies, each time on a fresh cluster, and prints each request statistic's
difference from `none`'s mean with a 95 % Welch interval between runs
(repeats.py): the run-to-run spread the bootstrap over one run leaves out.

The ceiling of this benchmark is the `oracle` policy measured in the same
run; `none` is the floor. Burst windows are fixed from the whole trace.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from speckv.loadgen.bench.e2e.engines import ENGINES, EngineSetup, engine_notes, engine_setup
from speckv.loadgen.bench.e2e.events import EventPlan, check_plan
from speckv.loadgen.bench.e2e.model import TrainedModel, train_before_slice
from speckv.loadgen.bench.e2e.run import PolicyRun, run_policy
from speckv.loadgen.experiments.action_table import action_table
from speckv.loadgen.experiments.bootstrap import BOOTSTRAP_RESAMPLES, bootstrap_intervals
from speckv.loadgen.experiments.e2e_config import E2EConfig, SliceSpec, load_e2e_config
from speckv.loadgen.experiments.event_metrics import event_figures
from speckv.loadgen.experiments.event_table import event_table, utilisation_table
from speckv.loadgen.experiments.metrics import burst_seconds, percentile, summarize
from speckv.loadgen.experiments.migration import DEFAULT_MIGRATION_LIMIT
from speckv.loadgen.experiments.repeats import repeat_figures, repeats_table
from speckv.loadgen.experiments.report import console_tables, markdown_table, write_report
from speckv.loadgen.experiments.results import (
    Comparison,
    FloorSummary,
    LiveRunFigures,
    LiveSetup,
    PolicySummary,
    with_avoidable_closed,
)
from speckv.loadgen.experiments.ttft_floor import floor_summary, slice_floor
from speckv.loadgen.experiments.utilisation import utilisation
from speckv.loadgen.workload.node_events import get_event_set, resolve
from speckv.services.cluster.status import wide_console
from speckv.services.common.config import CONFIG_DIR
from speckv.services.common.errors import InvalidArgument, NotFound
from speckv.services.common.traces import TraceRequest, load_mooncake
from speckv.services.scheduler.replication.outcomes import ActionStats

ALL_POLICIES = "none,reactive-heat,reactive-migrate,affinity,predictive,oracle"
VLLM_CONFIG = CONFIG_DIR / "e2e_vllm.json"  # the real engines' cluster (--engine vllm)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speckv bench e2e", description=__doc__)
    parser.add_argument("--trace", required=True, help="Mooncake JSONL trace")
    parser.add_argument("--policies", default=ALL_POLICIES, help="comma-separated, run in this order")
    parser.add_argument("--quick", action="store_true", help="the config's short 'quick' slice")
    parser.add_argument("--start-s", type=float, default=None, help="override the slice start (trace s)")
    parser.add_argument("--duration-s", type=float, default=None, help="override the slice length (trace s)")
    parser.add_argument("--speed", type=float, default=None, help="override the time compression")
    parser.add_argument("--config", default=None, help="e2e config JSON (default: the committed one)")
    parser.add_argument("--engine", choices=ENGINES, default="emulated",
                        help="emulated: the profile-driven engine; torch: a small real PyTorch model on the CPU "
                             "writing real KV (tokens scaled 1/32); vllm: real vLLM OpenAI servers with "
                             "SpeckvConnector (tokens scaled 1/16; its own config, services/config/e2e_vllm.json)")
    parser.add_argument("--model", type=Path, default=None,
                        help="with --engine vllm: the engines' local model directory (default: the tiny random "
                             "Llama, written once under ~/.cache/speckv)")
    parser.add_argument("--json", default=None, help="write the result JSON here")
    parser.add_argument("--report", default=None, help="write the HTML report into this directory")
    parser.add_argument("--events", default=None, metavar="NAME",
                        help="play a node event set (node loss, node addition) of services/config/events.json (or "
                             "--events-file) during each replay")
    parser.add_argument("--events-file", default=None, help="the file of --events sets (default: the committed one)")
    parser.add_argument("--repeats", type=int, default=1, metavar="N",
                        help="replay the slice N times per policy, round-robin over the policies, and give each "
                             "request statistic a between-runs interval against none's (repeats.py)")
    parser.add_argument("--migration-limit", type=int, default=DEFAULT_MIGRATION_LIMIT,
                        help="times the router re-sends a request whose node died (default %(default)s)")
    args = parser.parse_args(list(argv))
    if args.events_file and not args.events:
        raise InvalidArgument("--events-file names the file of --events sets: give --events too")
    if args.migration_limit < 0:
        raise InvalidArgument(f"--migration-limit={args.migration_limit}: must be >= 0")
    if args.repeats < 1:
        raise InvalidArgument(f"--repeats={args.repeats}: must be >= 1")
    if args.events:  # an unknown set or a bad file fails here, before any cluster starts
        get_event_set(args.events, args.events_file)
    args.policy_list = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not args.policy_list or len(set(args.policy_list)) != len(args.policy_list):
        raise InvalidArgument(f"--policies={args.policies!r}: name each policy once")
    return args


def choose_slice(config: E2EConfig, args: argparse.Namespace) -> SliceSpec:
    base = config.slices["quick" if args.quick else "full"]
    chosen = SliceSpec(base.start_s if args.start_s is None else args.start_s,
                       base.duration_s if args.duration_s is None else args.duration_s,
                       base.speed if args.speed is None else args.speed)
    if chosen.duration_s <= 0 or chosen.speed <= 0 or chosen.start_s < 0:
        raise InvalidArgument("--start-s >= 0, --duration-s > 0 and --speed > 0 are required")
    return chosen


def compare(trace_path: Path, policies: list[str], config: E2EConfig, slice_: SliceSpec,
            environ: Mapping[str, str], console, quick: bool = False,
            setup: EngineSetup | None = None, events: EventChoice | None = None, repeats: int = 1
            ) -> tuple[Comparison, dict[str, PolicyRun]]:
    """setup: the engines (None: the emulated ones); events: a node event set to play."""
    trace = load_mooncake(trace_path, family=config.family)
    return compare_requests(trace_path.name, trace, policies, config, slice_, environ, console, quick, setup,
                            events, repeats)


@dataclass(frozen=True, slots=True)
class EventChoice:
    """--events, --events-file and --migration-limit."""

    name: str
    path: str | None = None
    migration_limit: int = DEFAULT_MIGRATION_LIMIT

    def plan(self, in_slice: Sequence[TraceRequest]) -> EventPlan:
        specs = get_event_set(self.name, self.path)
        return EventPlan(tuple(resolve(specs, [r.arrival_s for r in in_slice], self.name)), self.migration_limit)


def compare_requests(name: str, trace: Sequence[TraceRequest], policies: list[str], config: E2EConfig,
                     slice_: SliceSpec, environ: Mapping[str, str], console, quick: bool = False,
                     setup: EngineSetup | None = None, events: EventChoice | None = None, repeats: int = 1
                     ) -> tuple[Comparison, dict[str, PolicyRun]]:
    """The comparison on a workload already loaded (a trace keyed into the
    config's families, or a synthetic one), in arrival order; name is what
    the result calls it. Every policy's summary carries its 95 % bootstrap
    intervals (ci95). With repeats > 1 the policies run that many rounds,
    each on fresh clusters; the summaries, runs and report are the first
    round's, and each summary's `repeats` holds every round's figures."""
    setup = setup or engine_setup(config)
    bursts = burst_seconds(r.arrival_s for r in trace)
    in_slice = [r for r in trace if slice_.start_s <= r.arrival_s < slice_.start_s + slice_.duration_s]
    if not in_slice:
        raise InvalidArgument(f"the slice [{slice_.start_s}, {slice_.start_s + slice_.duration_s}) s of "
                              f"{name} holds no request")
    plan = events.plan(in_slice) if events is not None else None
    check_plan(plan, setup.kind)
    console.print(f"{name}: {len(in_slice)} requests in [{slice_.start_s:g}, "
                  f"{slice_.start_s + slice_.duration_s:g}) s, {sum(1 for r in in_slice if int(r.arrival_s) in bursts)}"
                  f" in burst seconds; {config.nodes} nodes, {setup.kind} engines, replayed {slice_.speed:g}x faster; "
                  f"KV bytes scaled 1/{setup.byte_scale}")
    rounds: list[dict[str, PolicyRun]] = []
    summaries: dict[str, PolicySummary] = {}
    # The model in a folder of its own: that folder is the predictor's model root (ReloadModel by name).
    with tempfile.TemporaryDirectory(prefix="speckv-e2e-model-") as model_root:
        with quiet_lightgbm_training():
            model = train_before_slice(trace, slice_, Path(model_root) / "before-slice", quick, config.warmup_s)
        console.print(f"predictor: {model.describe()}")
        for round_ in range(repeats):
            label = f" ({round_ + 1}/{repeats})" if repeats > 1 else ""
            rounds.append({policy: _run_with_progress(config, policy, trace, slice_, environ, console,
                                                      model.directory, setup, plan, label)
                           for policy in policies})
    runs = rounds[0]
    # The floor prices the trace's own tokens with the emulated profile; the
    # torch and vllm engines run scaled prompts on this CPU, which it does not describe.
    history = [r for r in trace if r.arrival_s < slice_.start_s]
    floor = (slice_floor(history, in_slice, config.profile) if setup.kind == "emulated" else
             # The real engines' profile is fitted to them, and it prices their (scaled) tokens.
             slice_floor(setup.scale(history), setup.scale(in_slice), config.profile) if setup.kind == "vllm"
             else None)
    reusable = floor.by_request_key() if floor is not None else None
    shared = floor.shared_by_request_key() if floor is not None else None
    def summary_of(run: PolicyRun) -> PolicySummary:
        return summarize(run.records, bursts, config.ttft_target_ms, run.replicas, setup.real_bytes_per_block,
                         run.orders, reusable, config.profile, shared)

    for policy in policies:
        run = runs[policy]
        summaries[policy] = replace(summary_of(run), live=_live_figures(run),
                                    actions=_actions_of(run, setup),
                                    ci95=bootstrap_intervals(run.records, bursts, config.ttft_target_ms, reusable,
                                                             shared),
                                    utilisation=utilisation(run.records, config.ttft_target_ms, list(run.lifetimes),
                                                            run.lifetimes).to_json(),
                                    events=([event_figures(run.records, e).to_json() for e in run.node_events]
                                            if plan is not None else None),
                                    repeats=(repeat_figures([summary_of(r[policy]) for r in rounds])
                                             if repeats > 1 else None))
    floor_row = (floor_summary(floor.floor_ms, [r.arrival_s for r in in_slice], bursts, floor.returning)
                 if floor is not None else None)
    result = Comparison(
        trace=name, slice=slice_, ttft_target_ms=config.ttft_target_ms,
        byte_scale_factor=setup.byte_scale, nodes=config.nodes, engine_profile=config.profile.name,
        link_gbps=config.link.gbps, real_bytes_per_block=setup.real_bytes_per_block,
        burst_seconds_in_trace=len(bursts), policies=with_avoidable_closed(summaries, floor_row), floor=floor_row,
        notes=_notes(config, slice_, model, setup, repeats),
        live=LiveSetup(engine=setup.kind, kvstore_bytes_per_block=setup.geometry.bytes_per_block,
                       family=config.family, predictor_model=model.describe()))
    return result, runs


def _actions_of(run: PolicyRun, setup: EngineSetup) -> dict[str, dict[str, object]] | None:
    """The run's per-action outcomes as the simulator reports them (to_json),
    bytes counted as the results count them (real-model bytes of each block);
    None when the policy issued no order. The first round's, as the other figures."""
    scale = setup.real_bytes_per_block / setup.geometry.bytes_per_block
    return {kind: real_bytes(stats, scale).to_json() for kind, stats in sorted(run.actions.items())} or None


def real_bytes(stats: ActionStats, scale: float) -> ActionStats:
    """stats with every byte figure multiplied by scale (rounded)."""
    out = stats.copy()
    out.bytes = round(stats.bytes * scale)
    out.bytes_by_outcome = {k: round(v * scale) for k, v in stats.bytes_by_outcome.items()}
    out.bytes_read_after_lease = round(stats.bytes_read_after_lease * scale)
    out.by_forecast = {name: real_bytes(part, scale) for name, part in stats.by_forecast.items()}
    return out


def _live_figures(run: PolicyRun) -> LiveRunFigures:
    used_pages = sum(s.used_pages for s in run.kvstores.values())
    if run.warm is None:
        return LiveRunFigures(run.wall_s, used_pages)
    return LiveRunFigures(run.wall_s, used_pages, run.warm.routed, run.warm.stored_blocks, run.warm.seconds)


def _notes(config: E2EConfig, slice_: SliceSpec, model: TrainedModel, setup: EngineSetup,
           repeats: int = 1) -> list[str]:
    warm_kv = (f"stores the newest requests' KV, up to {config.warm_kv_fraction:.0%} of the pages"
               if setup.spec is None else
               f"computes (real prefill) the newest requests' KV, at most {setup.warm_kv_blocks} blocks in all")
    return [
        *engine_notes(setup, config),
        f"Families: '{config.family}' keying of the trace (routes, predictor observations and training, "
        "planner and oracle alike).",
        f"Predictor: {model.describe()}.",
        f"Warm start: before each replay the fresh cluster routes the {config.warmup_s:g} s of trace before the "
        f"slice through the scheduler (the predictor observes them) and {warm_kv}, where they were routed.",
        f"Forecast horizons are wall seconds of the services: at speed {slice_.speed:g} a horizon covers "
        f"{slice_.speed:g}x as much trace time.",
        "Live figures come from one run of each policy on a shared machine: identical runs move a p99 of a few "
        "hundred requests by tens of percent, so a difference between policies that moved no bytes is noise "
        "(avoidable closed included). Each latency and SLO figure carries a 95 % percentile bootstrap interval "
        f"over the slice's requests (ci95; {BOOTSTRAP_RESAMPLES} draws): a difference inside it is a tie, and "
        "since it leaves out the run-to-run spread, one outside it is a hint. Verdicts come from `speckv "
        "simulate` of the same slice.",
        "Speculative actions: the scheduler's own outcome totals (GetClusterState) after the drain of each "
        "policy's first run; the policy is set once the warm start is done (routing does not depend on it), so "
        "it plans nothing before the slice, as in the simulator; bytes in real-model bytes, as above.",
        *([f"Repeats: every policy replayed the slice {repeats} times, round-robin over the policies, each on a "
           "fresh cluster; the figures above are the first round's, `repeats` in the JSON holds every round's, "
           "and the between-runs table gives each figure's difference from none's mean a 95 % Welch interval "
           "(repeats.py), which does cover the run-to-run spread."] if repeats > 1 else []),
    ]


@contextlib.contextmanager
def quiet_lightgbm_training() -> Iterator[None]:
    """Training the predictor without LightGBM's "Overriding the parameters
    from Reference Dataset" UserWarning on the console: the training builds
    its validation Dataset with `reference=` the training one, on purpose, so
    that both share the training set's bins, and LightGBM warns whenever a
    referencing Dataset adopts its reference's parameters. Only that message
    from lightgbm is silenced; any other warning still shows."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Overriding the parameters from Reference Dataset",
                                category=UserWarning, module=r"lightgbm(\.|$)")
        yield


def _run_with_progress(config, policy, trace, slice_, environ, console, model_dir: Path,
                       setup: EngineSetup, events: EventPlan | None = None, label: str = "") -> PolicyRun:
    columns = (TextColumn(f"{policy + label:>16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[status]}"))
    ttfts: list[float] = []
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(policy, total=None, status="starting cluster")

        def update(total: int, done: int, record) -> None:
            if record is not None and record.ttft_ms is not None:
                ttfts.append(record.ttft_ms)
            p99 = percentile(ttfts[-500:], 99)
            progress.update(task, total=total, completed=done,
                            status=f"sent {total} done {done} p99 {p99:.0f} ms" if p99 else f"done {done}")

        return run_policy(config, policy, trace, slice_, environ, update, model_dir=model_dir, setup=setup,
                          events=events)


def print_table(console, policies: Mapping[str, PolicySummary], engine: str = "emulated",
                floor: FloorSummary | None = None) -> None:
    unit = {"torch": "trace-time ms of the torch model on this CPU",
            "vllm": "ms of the real vLLM engines on this CPU, x the replay's speed"}.get(engine, "real-model ms")
    for table in console_tables(f"end-to-end comparison (TTFT in {unit})", policies, floor):
        console.print(table)


def write_outputs(result: Comparison, runs: Mapping[str, PolicyRun], args_json: str | None, report: str | None,
                  console, forecast_horizon_s: float) -> Path | None:
    """forecast_horizon_s: the horizon the predictor was polled at, in trace s (the report's time line)."""
    if args_json:
        Path(args_json).write_text(json.dumps(result.to_json(), indent=2))
        console.print(f"JSON written to {args_json}")
    if not report:
        return None
    any_run = next(iter(runs.values()))
    arrivals = [(r.arrival_s, r.family) for r in any_run.records]
    timelines = {name: {"forecasts": run.forecasts, "forecast_horizon_s": forecast_horizon_s,
                        "commits": [(t, blocks * result.real_bytes_per_block, f)
                                    for t, blocks, f in run.replicas.commits]}
                 for name, run in runs.items()}
    ttfts = {name: [r.ttft_ms for r in run.records if r.served] for name, run in runs.items()}
    index = write_report(Path(report), result, ttfts, timelines, arrivals)
    console.print(f"report: {index}")
    return index


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    args = parse_args(argv)
    trace_path = Path(args.trace)
    if not trace_path.exists():
        raise NotFound(f"trace {trace_path} not found")
    if args.model is not None and args.engine != "vllm":
        raise InvalidArgument("--model names the vllm engines' model: give --engine vllm too")
    config = load_e2e_config(args.config or (VLLM_CONFIG if args.engine == "vllm" else None))
    console = wide_console()
    events = EventChoice(args.events, args.events_file, args.migration_limit) if args.events else None
    slice_, setup = choose_slice(config, args), engine_setup(config, args.engine, args.model)
    result, runs = compare(trace_path, args.policy_list, config, slice_, environ, console, quick=args.quick,
                           setup=setup, events=events, repeats=args.repeats)
    print_table(console, result.policies, args.engine, result.floor)
    for title, table in (("utilisation (utilisation.py)", utilisation_table(result.policies)),
                         ("node events (event_metrics.py; live: affected = the lost node's families)",
                          event_table(result.policies))):
        if table:
            console.print(title)
            console.print(table, markup=False)
    console.print(markdown_table(result.policies, result.floor), markup=False)
    actions = action_table(result.policies)
    if actions:
        console.print(f"speculative actions (the first run of each policy):\n{actions}", markup=False)
    between = repeats_table(result.policies)
    if between:
        console.print(f"between {args.repeats} runs of each policy (repeats.py: mean, difference from none's "
                      f"mean, 95 % Welch interval; a tie holds 0):\n{between}", markup=False)
    # The predictor is polled at forecast_horizon_s of its own (wall) time: speed times as many trace s.
    write_outputs(result, runs, args.json, args.report, console, config.forecast_horizon_s * slice_.speed)
    return 1 if any(m.served == 0 for m in result.policies.values()) else 0
