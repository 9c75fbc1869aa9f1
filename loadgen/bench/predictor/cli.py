"""`speckv bench predictor [--trace PATH | --all] [--quick] [--json PATH]`.

With --trace, one workload; without it (or with --all), every trace file of
the traces directory (--traces, else SPECKV_TRACES, else ../shared/traces
beside the project root) in a format the loaders know, then every synthetic
scenario of services/config/scenarios.json (or --scenarios), one seed each.
`--trace synthetic:NAME` runs one scenario. One table per workload, then an
overview; --json writes the single report, or {"reports": [...], "wall_s"}
for several.

Each workload (predictor/run.py) is split chronologically at 70 % of its
steps. LightGBM and the baselines (fitted only on the first 70 %) are scored
on the rows of the last 30 %: for each model and horizon the mean and median
absolute error, RMSE, pinball loss of the upper quantile, burst precision /
recall / F1, lead time (median and mean seconds from the first alarm to the
burst's onset over the bursts alarmed) and the share of bursts alarmed
before onset (evaluation.py defines them as events). "served" is what the
predictor serves: per horizon and family class the point forecast chosen on
the validation slice (the newest 20 % of the first 70 %; selection.py), and
per horizon the burst probability chosen there (burst_model.py), never on
the reported rows; the summary puts its MAE beside the best baseline's
(ARIMA included, though only the baselines the features carry are served
candidates) and beside the Poisson floor (predictor/evaluation.py). Also:
training time (features + fit on the 70 %), and Forecast latency through
the predictor core for 1, 1,000 and 10,000 families with the model's
compiled trees and with LightGBM's predict, in the same run, whether the two
answers are identical, and where the compiled 10,000-family forecast's time
goes (predictor/latency.py).
Bins: config step_s, unless the workload's timestamps are coarser (the
Mooncake conversation trace arrives in batches every ~3 s): then bins of
that resolution rounded up to whole config steps, and each horizon rounded
up to whole bins, so no bin or horizon is finer than the data.
Hyperparameters come from services/config/predictor.json, fixed; nothing is
tuned on the reported rows. --quick: the config's quick rounds, and each
scenario cut to its first QUICK_SCENARIO_S seconds (a CI-sized run);
--no-latency skips the latency measurement (tests).

--crafted N runs only the hardening part (predictor/crafted.py), none of
the workloads: N crafted model directories (seeded by --seed) offered to a
live `speckv predictor` process by ReloadModel, then a table per mutation
kind and the totals against issue 22's target (0 predictor deaths, 0
INTERNAL); --json writes {"crafted": report}. It answers another question
than the workloads (does a bad model directory hurt the service, not how
well a good one forecasts) and costs no trace, so it runs alone.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Iterator, Mapping

from speckv.loadgen.bench.predictor.crafted import print_crafted, run_crafted
from speckv.loadgen.bench.predictor.run import Workload, evaluate, timestamp_resolution_s
from speckv.loadgen.workload.scenarios import get_scenario, load_scenarios
from speckv.services.common.traces import TraceFormatError, load_trace, resolve_traces_dir, trace_format
from speckv.services.common.traces.azure import time_of_day_s
from speckv.services.predictor.fitting.training import load_config

__all__ = ["main", "timestamp_resolution_s"]

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SYNTHETIC = "synthetic:"
SCENARIO_SEED = 7  # the generators' own default seed: one workload per scenario
SCENARIO_BLOCK_TOKENS = 512  # the Mooncake traces' block; counts do not depend on it
QUICK_SCENARIO_S = 1200.0  # 20 minutes: 14 min to train on, 6 to report on


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    args = _parse(argv)
    if args.crafted is not None:
        crafted = run_crafted(args.crafted, args.seed)
        print_crafted(crafted)
        if args.json:
            Path(args.json).write_text(json.dumps({"crafted": crafted}, indent=2), encoding="utf-8")
        return 0
    began = time.perf_counter()
    reports = []
    for workload, tod in _workloads(args, environ):
        config = load_config(args.config, quick=args.quick, tod_offset_s=tod)
        report = evaluate(workload, config, args.family, args.quick, latency=not args.no_latency)
        _print(report, tuple(report["horizons_s"]))
        reports.append(report)
    wall_s = time.perf_counter() - began
    if len(reports) > 1:
        _print_overview(reports, wall_s)
    if args.json:
        out = reports[0] if len(reports) == 1 else {"reports": reports, "wall_s": wall_s, "quick": args.quick}
        Path(args.json).write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


def _workloads(args: argparse.Namespace, environ: Mapping[str, str]) -> Iterator[tuple[Workload, float]]:
    """(workload, time-of-day offset of its step 0) in the order they run."""
    if args.trace and args.trace.startswith(SYNTHETIC):
        yield _scenario(args.trace[len(SYNTHETIC):], args)
        return
    if args.trace and not args.all:
        path = Path(args.trace)
        if not path.exists():
            path = _traces_dir(args, environ) / args.trace
        yield _trace(path, args.family)
        return
    for path in sorted(_traces_dir(args, environ).iterdir()):
        if path.is_file() and _known(path):
            yield _trace(path, args.family)
    for name in load_scenarios(args.scenarios):
        yield _scenario(name, args)


def _traces_dir(args: argparse.Namespace, environ: Mapping[str, str]) -> Path:
    """--traces, else SPECKV_TRACES, else ../shared/traces beside the project root."""
    if args.traces or environ.get("SPECKV_TRACES"):
        return resolve_traces_dir(args.traces, environ)
    return resolve_traces_dir(str(PROJECT_ROOT / ".." / "shared" / "traces"), environ)


def _known(path: Path) -> bool:
    try:
        trace_format(path)
    except TraceFormatError:
        return False
    return True


def _trace(path: Path, family: str) -> tuple[Workload, float]:
    tod = time_of_day_s(path) if trace_format(path) == "azure" else 0.0
    return Workload(path.name, load_trace(path, family=family), f"trace {path}"), tod


def _scenario(name: str, args: argparse.Namespace) -> tuple[Workload, float]:
    scenario = get_scenario(name, args.seed, SCENARIO_BLOCK_TOKENS, args.scenarios)
    source = f"--synthetic {name} --seed {args.seed}"
    if args.quick:
        scenario = dataclasses.replace(scenario, params=dataclasses.replace(
            scenario.params, duration_s=min(scenario.params.duration_s, QUICK_SCENARIO_S)))
        source += f", first {scenario.params.duration_s:g} s (--quick)"
    return Workload(f"{SYNTHETIC}{name}", scenario.requests(), source), 0.0


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="speckv bench predictor", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=None, help="one trace file, a name inside the traces directory, or "
                   "synthetic:SCENARIO (default: every trace and scenario)")
    p.add_argument("--all", action="store_true", help="every trace of the traces directory and every scenario")
    p.add_argument("--traces", default=None, help="traces directory (default: SPECKV_TRACES, ../shared/traces)")
    p.add_argument("--scenarios", default=None, help="scenarios file (default: services/config/scenarios.json)")
    p.add_argument("--seed", type=int, default=SCENARIO_SEED, help="the synthetic scenarios' seed (with "
                   "--crafted: the crafted directories')")
    p.add_argument("--family", default="auto", help="family assignment: auto, prefix, conversation, service")
    p.add_argument("--quick", action="store_true", help="fewer boosting rounds (services/config/predictor.json "
                   f"quick), scenarios cut to {QUICK_SCENARIO_S:g} s")
    p.add_argument("--config", default=None, help="hyperparameter file (default: services/config/predictor.json)")
    p.add_argument("--json", default=None, help="write the report(s) here")
    p.add_argument("--no-latency", action="store_true", help="skip the forecast latency measurement (tests)")
    p.add_argument("--crafted", type=_positive, default=None, metavar="N",
                   help="only offer N crafted model directories to a live predictor by ReloadModel and count "
                   "deaths and INTERNAL codes per mutation kind (no workloads)")
    return p.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be an integer >= 1")
    return value


def _fmt(v: float | None, width: int) -> str:
    if v is None:
        return f"{'-':>{width}}"
    return f"{v:>{width}.3f}" if abs(v) < 100 else f"{v:>{width}.0f}"


def _print(report: dict, horizons: tuple[float, ...]) -> None:
    """One workload's table: every model at every horizon, then the summary,
    the burst choice, training time and latency."""
    print(f"\n{'model':<15}{'h':>4}{'MAE':>9}{'medAE':>7}{'RMSE':>9}{'pinball':>9}{'prec':>7}{'recall':>7}"
          f"{'F1':>7}{'lead':>7}{'mean':>7}{'early':>7}{'bursts':>7} | returns:{'prec':>6}{'recall':>7}{'n':>6}")
    for name, per in report["models"].items():
        for h in horizons:
            m = per[f"h{h:g}"]
            print(f"{name:<15}{h:>4g}{m['mae']:>9.4f}{_fmt(m['median_ae'], 7)}{m['rmse']:>9.4f}{m['pinball']:>9.4f}"
                  f"{_fmt(m['burst_precision'], 7)}{_fmt(m['burst_recall'], 7)}{_fmt(m['burst_f1'], 7)}"
                  f"{_fmt(m['lead_time_s'], 7)}{_fmt(m['lead_mean_s'], 7)}{_fmt(m['burst_early'], 7)}"
                  f"{m['burst_episodes']:>7} |         {_fmt(m['return_precision'], 6)}"
                  f"{_fmt(m['return_recall'], 7)}{m['return_episodes']:>6}")
    print("(lead: median and mean seconds from the first alarm to the burst's onset, alarmed bursts; early: share of "
          "all bursts alarmed before onset)")
    print(f"\n{'h':>5}{'served MAE':>12}{'best baseline':>26}{'ratio':>7}{'best servable':>26}{'ratio':>7}"
          f"{'Poisson floor':>15}")
    for h in horizons:
        m = report["summary"][f"h{h:g}"]
        print(f"{h:>5g}{m['served_mae']:>12.4f}{m['best_baseline']:>15} {m['best_baseline_mae']:>10.4f}"
              f"{m['ratio']:>7.3f}{m['best_servable_baseline']:>15} {m['best_servable_mae']:>10.4f}"
              f"{m['ratio_servable']:>7.3f}{m['poisson_floor_mae']:>15.4f}")
    print("\nserved point forecast per horizon and class (chosen on the validation slice):")
    for c in report["choices"]:
        weights = ", ".join(f"{n} {w:g}" for n, w in c["weights"].items())
        print(f"  h {c['horizon_s']:g} s, {c['family_class']:<8} {c['chosen']:<16} [{weights}] "
              f"on {c['rows']} rows{' (inherited)' if c['inherited'] else ''}")
    _print_burst_choice(report)
    print(f"\ntrain_s {report['train_s']:.2f} (features {report['features_s']:.2f}, fit {report['fit_s']:.2f}; "
          f"CPU {report['train_cpu_s']:.2f} s); "
          f"1-min load average at the end {report['load_average_1m']:.1f} on {os.cpu_count()} cores")
    if report["latency"] is not None:
        _print_latency(report["latency"])
    else:
        print("\nForecast latency: not run (--no-latency)")


def _print_burst_choice(report: dict) -> None:
    choice = report.get("burst_choice")
    if not choice:
        print("served burst probability: the count distribution's (no burst classifiers)")
        return
    print("served burst probability per horizon (chosen on the validation slice by event F1):")
    for h, source, scores, n in zip(report["horizons_s"], choice["sources"], choice["scores"], choice["episodes"]):
        parts = [f"{name} F1 {_fmt(v['f1'], 0).strip()} at {v['threshold']:g}" for name, v in scores.items()]
        print(f"  h {h:g} s: {source:<19} ({'; '.join(parts)}; {n} validation bursts)")


def _print_overview(reports: list[dict], wall_s: float) -> None:
    """One line per workload and horizon: the figures the issue's targets name."""
    print(f"\n== overview ({len(reports)} workloads, {wall_s:.0f} s)")
    print(f"{'workload':<36}{'h':>4}{'ratio':>7}{'best baseline':>16}{'medAE':>7}{'prec':>7}{'recall':>7}"
          f"{'lead':>7}{'mean':>7}{'early':>7}{'bursts':>7}{'train s':>9}{'ms@1':>7}{'ms@1k':>7}{'ms@10k':>8}")
    for r in reports:
        ms = r["latency"]["forecast_ms"]["compiled"] if r["latency"] else None
        for i, h in enumerate(r["horizons_s"]):
            m = r["summary"][f"h{h:g}"]
            tail = f"{r['train_s']:>9.2f}{_latency_columns(ms)}" if i == 0 else ""
            print(f"{r['trace'][:35]:<36}{h:>4g}{m['ratio']:>7.3f}{m['best_baseline']:>16}"
                  f"{_fmt(m['served_median_ae'], 7)}{_fmt(m['burst_precision'], 7)}{_fmt(m['burst_recall'], 7)}"
                  f"{_fmt(m['lead_time_s'], 7)}{_fmt(m['lead_mean_s'], 7)}{_fmt(m['burst_early'], 7)}"
                  f"{m['burst_episodes']:>7}{tail}")


def _latency_columns(ms: dict[str, float] | None) -> str:
    """The overview's ms@1, ms@1k, ms@10k: what was measured, "not run" across them where latency was not."""
    if ms is None:
        return f"{'(latency not run)':>22}"
    return "".join(f"{_fmt_ms(ms.get(n)):>{w}}" for n, w in (("1", 7), ("1000", 7), ("10000", 8)))


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _print_latency(latency: dict) -> None:
    sizes = list(latency["forecast_ms"]["compiled"])
    print(f"\nForecast latency, ms (median; served by: {latency['inference']}; compiled in "
          f"{latency['compile_s']:.1f} s; answers for every family identical bit for bit: "
          f"{'yes' if latency['identical'] else 'NO'})")
    print(f"{'families':<10}" + "".join(f"{n:>9}" for n in sizes) + f"{'CPU ms at ' + sizes[-1]:>20}")
    for path, per in latency["forecast_ms"].items():
        print(f"{path:<10}" + "".join(f"{per[n]:>9.2f}" for n in sizes)
              + f"{latency['forecast_cpu_ms_10k'][path]:>20.2f}")
    b, derived = latency["breakdown_ms_10k"], latency.get("breakdown_derived_ms_10k", {})
    timed = [("features", "features"), ("count_trees", "count trees"), ("level_free", "level-free features and trees"),
             ("distribution", "distribution"), ("burst_trees", "burst classifiers"), ("predict", "the model's predict")]
    print(f"compiled, {sizes[-1]} families on one thread, each timed alone (medians): forecast "
          f"{b['forecast_one_thread']:.1f} ms; " + ", ".join(f"{label} {b[k]:.1f}" for k, label in timed if k in b))
    if derived:
        print(f"  derived, not timed (differences of those medians): core outside the model and features "
              f"{derived['core_rest']:.1f}, model outside its timed parts {derived['model_rest']:.1f}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], {}))
