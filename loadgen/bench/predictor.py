"""`speckv bench predictor --trace PATH [--quick] [--json PATH]`.

Splits the trace chronologically at 70 % of its steps. LightGBM and the
baselines (fitted only on the first 70 %) are scored on the rows of the last
30 %: for each model and horizon MAE and RMSE of the count, pinball loss of
the upper quantile, burst precision / recall / F1 and median lead time
(evaluation.py defines them as events). "served" is what the predictor
serves: per horizon and family class the point forecast chosen on the
validation slice (the newest 20 % of the first 70 %; selection.py), never on
the reported rows; the summary puts its MAE beside the best baseline's
(ARIMA included, though only the baselines the features carry are served
candidates) and beside the Poisson floor (_predictor_eval.py). Also:
training time (features + fit on the 70 %), and Forecast latency through
the predictor core for 1, 1,000 and 10,000 families with the model's
compiled trees and with LightGBM's predict, in the same run, whether the two
answers are identical, and where the compiled 10,000-family forecast's time
goes (_predictor_latency.py).
Bins: config step_s, unless the trace's timestamps are coarser (the 1st
percentile of gaps between distinct timestamps, RESOLUTION_QUANTILE; the
Mooncake conversation trace arrives in batches every ~3 s): then bins of
that resolution rounded up to whole config steps, and each horizon rounded
up to whole bins, so no bin or horizon is finer than the data.
Hyperparameters come from services/config/predictor.json, fixed; nothing is
tuned on the reported rows.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Mapping

import numpy as np

from speckv.loadgen.bench._predictor_eval import (
    alarm_thresholds,
    candidate_outputs,
    lgbm_outputs,
    poisson_floor,
    poisson_outputs,
    return_thresholds,
    score,
)
from speckv.loadgen.bench._predictor_latency import forecast_latency
from speckv.services.common.traces import load_trace, resolve_traces_dir, trace_format
from speckv.services.common.traces.azure import time_of_day_s
from speckv.services.predictor.arima import Arima
from speckv.services.predictor.baselines import Ewma, LastValue, SeasonalNaive
from speckv.services.predictor.dataset import build_rows
from speckv.services.predictor.family_counts import FamilyCounts, aggregate
from speckv.services.predictor.feature_baselines import NAMES as SERVABLE_BASELINES
from speckv.services.predictor.features import FeatureSpec
from speckv.services.predictor.lgbm_forecaster import MODEL_CANDIDATES
from speckv.services.predictor.training import at_step, load_config, split_validation, train_on_counts

TRAIN_FRACTION = 0.7
# Timestamp resolution: a low percentile of the gaps between distinct arrival times. Unquantised traces
# have some near-simultaneous arrivals (gaps of ms); a trace stamped in batches has none below its period.
RESOLUTION_QUANTILE = 1.0


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    args = _parse(argv)
    path = Path(args.trace)
    if not path.exists():
        path = resolve_traces_dir(args.traces, environ) / args.trace
    tod = time_of_day_s(path) if trace_format(path) == "azure" else 0.0
    config = load_config(args.config, quick=args.quick, tod_offset_s=tod)
    requests = load_trace(path, family=args.family)
    times = np.array([r.arrival_s for r in requests])
    resolution = timestamp_resolution_s(times)
    config = at_step(config, config.step_s * max(1, math.ceil(resolution / config.step_s - 1e-6)))
    counts = aggregate(times, [r.family for r in requests], config.step_s)
    split = int(TRAIN_FRACTION * counts.steps)
    train_counts = FamilyCounts(counts.families, counts.counts[:, :split].tocsr(), counts.step_s, counts.start_s)
    train_counts = _active(train_counts)
    print(f"trace {path.name}: {len(requests)} requests, {len(counts.families)} families, {counts.steps} steps "
          f"of {counts.step_s:g} s (timestamp resolution {resolution:.3g} s), horizons "
          f"{[f'{h:g}' for h in config.horizons_s]} s; train on steps < {split}, report on the rest", flush=True)

    result = train_on_counts(train_counts, config)  # timed: exactly what a retrain does
    bundle = result.bundle
    forecasters = _baselines(config, bundle.spec, train_counts)  # the bundle's feature columns
    print(f"trained on {len(result.rows)} rows: features {result.features_s:.1f} s, fit {result.fit_s:.1f} s; "
          f"{len(bundle.spec.names())} features (time of day {'kept' if bundle.spec.time_of_day else 'dropped'}), "
          f"trees per horizon {[b.num_trees() for b in bundle.boosters['count']]}, "
          f"dispersion {[round(d, 3) for d in bundle.dispersion]}", flush=True)
    test = build_rows(counts, bundle.spec, config.horizons_s, config.track_s, forecasters)
    test = test.take(np.flatnonzero(test.step >= split))
    # the baselines' alarm thresholds come from the same validation slice, built again with them (untimed)
    _, valid = split_validation(build_rows(train_counts, bundle.spec, config.horizons_s, config.track_s,
                                           forecasters), config.validation_fraction)

    models: dict[str, dict] = {}
    q, step, spec = config.quantile, config.step_s, bundle.spec
    H = config.horizons_s
    served_test, served_valid = lgbm_outputs(bundle, test.X), lgbm_outputs(bundle, valid.X)
    served_returns = return_thresholds(valid, served_valid, spec, H, step)
    models["served"] = score(test, served_test, bundle.alarm_threshold, spec, H, q, step, served_returns)
    # each model candidate alone, with the same distribution (quantile, burst and return alarms)
    for name in (n for n in MODEL_CANDIDATES if n in bundle.candidate_names()):
        models[name] = score(test, candidate_outputs(bundle, test.X, served_test, name), bundle.alarm_threshold,
                              spec, H, q, step, served_returns)
    for f in forecasters:
        out_valid = poisson_outputs(valid.baselines[f.name], valid.threshold, q)
        out_test = poisson_outputs(test.baselines[f.name], test.threshold, q)
        models[f.name] = score(test, out_test, alarm_thresholds(valid, out_valid, step), spec, H, q, step,
                               return_thresholds(valid, out_valid, spec, H, step))
    floor = poisson_floor(test, counts, H)
    latency = forecast_latency(bundle, counts.step_s)
    report = {"trace": path.name, "load_average_1m": os.getloadavg()[0], "family": args.family, "quick": args.quick,
              "requests": len(requests), "timestamp_resolution_s": resolution, "step_s": config.step_s,
              "horizons_s": list(H),
              "families": len(counts.families), "train_rows": len(result.rows), "test_rows": len(test),
              "train_s": bundle.train_s, "train_cpu_s": bundle.extra["train_cpu_s"], "features_s": result.features_s,
              "fit_s": result.fit_s, "trees": {k: [b.num_trees() for b in v] for k, v in bundle.boosters.items()},
              "dispersion": bundle.dispersion, "time_of_day": bundle.spec.time_of_day,
              "forecast_ms_1": latency["forecast_ms_1"], "forecast_ms_10k": latency["forecast_ms_10k"],
              "latency": latency,
              "season_steps": next(f.period for f in forecasters if isinstance(f, SeasonalNaive)),
              "choices": [c.to_dict() for c in bundle.selection.choices] if bundle.selection else [],
              "summary": _summary(models, floor, H), "models": models}
    _print(report, H)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


def timestamp_resolution_s(times_s: np.ndarray) -> float:
    """The RESOLUTION_QUANTILE percentile of the gaps between consecutive
    distinct arrival times, seconds (0 with fewer than two)."""
    distinct = np.unique(np.asarray(times_s, dtype=np.float64))
    if len(distinct) < 2:
        return 0.0
    return float(np.percentile(np.diff(distinct), RESOLUTION_QUANTILE))


def _summary(models: dict[str, dict], floor: np.ndarray, horizons: tuple[float, ...]) -> dict[str, dict]:
    """Per horizon: the served MAE, the best baseline (all of them, ARIMA
    too) and the best servable one, their ratios, and the Poisson floor."""
    out: dict[str, dict] = {}
    for i, h in enumerate(horizons):
        key = f"h{h:g}"
        served = models["served"][key]["mae"]
        baselines = {n: m[key]["mae"] for n, m in models.items() if n in (*SERVABLE_BASELINES, "arima")}
        best = min(baselines, key=baselines.get)
        servable = min((n for n in baselines if n in SERVABLE_BASELINES), key=baselines.get)
        out[key] = {"served_mae": served, "best_baseline": best, "best_baseline_mae": baselines[best],
                    "ratio": served / baselines[best] if baselines[best] > 0 else math.nan,
                    "best_servable_baseline": servable, "best_servable_mae": baselines[servable],
                    "ratio_servable": served / baselines[servable] if baselines[servable] > 0 else math.nan,
                    "poisson_floor_mae": float(floor[i])}
    return out


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="speckv bench predictor", description=__doc__.splitlines()[0])
    p.add_argument("--trace", required=True, help="trace file, or a name inside the traces directory")
    p.add_argument("--traces", default=None, help="traces directory (default: SPECKV_TRACES, ../shared/traces)")
    p.add_argument("--family", default="auto", help="family assignment: auto, prefix, conversation, service")
    p.add_argument("--quick", action="store_true", help="fewer boosting rounds (services/config/predictor.json quick)")
    p.add_argument("--config", default=None, help="hyperparameter file (default: services/config/predictor.json)")
    p.add_argument("--json", default=None, help="write the report here")
    return p.parse_args(argv)


def _active(counts: FamilyCounts) -> FamilyCounts:
    """Only the families that arrived in the training part."""
    keep = np.flatnonzero(np.diff(counts.counts.indptr) > 0)
    return FamilyCounts([counts.families[i] for i in keep], counts.counts[keep], counts.step_s, counts.start_s)


def _baselines(config, spec: FeatureSpec, train: FamilyCounts) -> list:
    """The bench's baselines over rows of `spec` (the trained bundle's: its
    lags include the seasonal ones). The period is the one training fitted."""
    b = config.baselines
    total = train.total()
    period = SeasonalNaive.fit_period(total, round(float(b["max_season_s"]) / config.step_s))
    pooled = total / max(1, len(train.families))
    arima = Arima(tuple(b["arima_order"])).fit(pooled)
    return [LastValue(spec), Ewma(spec, float(b["ewma_halflife_s"])), SeasonalNaive(period), arima]


def _print(report: dict, horizons: tuple[float, ...]) -> None:
    print(f"\n{'model':<15}{'h':>4}{'MAE':>9}{'RMSE':>9}{'pinball':>9}{'prec':>7}{'recall':>7}{'F1':>7}"
          f"{'lead s':>7}{'bursts':>7} | returns:{'prec':>6}{'recall':>7}{'F1':>7}{'n':>6}")

    def fmt(v: float | None) -> str:
        return "   -" if v is None else f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"

    for name, per in report["models"].items():
        for h in horizons:
            m = per[f"h{h:g}"]
            print(f"{name:<15}{h:>4g}{m['mae']:>9.4f}{m['rmse']:>9.4f}{m['pinball']:>9.4f}{fmt(m['burst_precision']):>7}"
                  f"{fmt(m['burst_recall']):>7}{fmt(m['burst_f1']):>7}{fmt(m['lead_time_s']):>7}"
                  f"{m['burst_episodes']:>7} |         {fmt(m['return_precision']):>6}{fmt(m['return_recall']):>7}"
                  f"{fmt(m['return_f1']):>7}{m['return_episodes']:>6}")
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
    print(f"\ntrain_s {report['train_s']:.2f} (features {report['features_s']:.2f}, fit {report['fit_s']:.2f}; "
          f"CPU {report['train_cpu_s']:.2f} s); "
          f"1-min load average at the end {report['load_average_1m']:.1f} on {os.cpu_count()} cores")
    _print_latency(report["latency"])


def _print_latency(latency: dict) -> None:
    sizes = list(latency["forecast_ms"]["compiled"])
    print(f"\nForecast latency, ms (median; served by: {latency['inference']}; compiled in "
          f"{latency['compile_s']:.1f} s; answers for every family identical bit for bit: "
          f"{'yes' if latency['identical'] else 'NO'})")
    print(f"{'families':<10}" + "".join(f"{n:>9}" for n in sizes) + f"{'CPU ms at ' + sizes[-1]:>20}")
    for path, per in latency["forecast_ms"].items():
        print(f"{path:<10}" + "".join(f"{per[n]:>9.2f}" for n in sizes)
              + f"{latency['forecast_cpu_ms_10k'][path]:>20.2f}")
    b = latency["breakdown_ms_10k"]
    print(f"compiled, {sizes[-1]} families on one thread: {b['forecast_one_thread']:.1f} ms = core "
          f"{b['core_rest']:.1f} + features {b['features']:.1f} + count trees {b['count_trees']:.1f} + "
          f"level-free features and trees {b['level_free']:.1f} + distribution {b['distribution']:.1f} + "
          f"rest of the model {b['model_rest']:.1f}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], {}))
