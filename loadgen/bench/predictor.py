"""`speckv bench predictor --trace PATH [--quick] [--json PATH]`.

Splits the trace chronologically at 70 % of its steps. LightGBM and the
baselines (fitted only on the first 70 %) are scored on the rows of the last
30 %: for each model and horizon MAE and RMSE of the count, pinball loss of
the upper quantile, burst precision / recall / F1 and median lead time
(evaluation.py defines them as events). Also: training time (features +
fit on the 70 %), and Forecast latency through the predictor core for 1 and
for 10,000 families, beside the ceiling measured in the same run (one raw
Booster.predict call per booster on 10,000 rows).
Hyperparameters come from services/config/predictor.json, fixed; nothing is
tuned on the reported rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Mapping

import numpy as np

from speckv.loadgen.bench._predictor_eval import (
    alarm_thresholds,
    lgbm_outputs,
    median_outputs,
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
from speckv.services.predictor.training import load_config, split_validation, train_on_counts

TRAIN_FRACTION = 0.7


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    args = _parse(argv)
    path = Path(args.trace)
    if not path.exists():
        path = resolve_traces_dir(args.traces, environ) / args.trace
    tod = time_of_day_s(path) if trace_format(path) == "azure" else 0.0
    config = load_config(args.config, quick=args.quick, tod_offset_s=tod)
    requests = load_trace(path, family=args.family)
    counts = aggregate(np.array([r.arrival_s for r in requests]), [r.family for r in requests], config.step_s)
    split = int(TRAIN_FRACTION * counts.steps)
    train_counts = FamilyCounts(counts.families, counts.counts[:, :split].tocsr(), counts.step_s, counts.start_s)
    train_counts = _active(train_counts)
    print(f"trace {path.name}: {len(requests)} requests, {len(counts.families)} families, {counts.steps} steps "
          f"of {counts.step_s:g} s; train on steps < {split}, report on the rest", flush=True)

    forecasters = _baselines(config, train_counts)
    result = train_on_counts(train_counts, config)  # timed: exactly what a retrain does
    bundle = result.bundle
    print(f"trained on {len(result.rows)} rows: features {result.features_s:.1f} s, fit {result.fit_s:.1f} s; "
          f"{len(bundle.spec.names())} features (time of day {'kept' if bundle.spec.time_of_day else 'dropped'}), "
          f"trees per horizon {[b.num_trees() for b in bundle.boosters['count']]}, "
          f"dispersion {[round(d, 3) for d in bundle.dispersion]}", flush=True)
    test = build_rows(counts, bundle.spec, config.horizons_s, config.track_s, forecasters)
    test = test.take(np.flatnonzero(test.step >= split))
    # the baselines' alarm thresholds come from the same validation slice, built again with them (untimed)
    _, valid = split_validation(build_rows(train_counts, bundle.spec, config.horizons_s, config.track_s, forecasters),
                                config.validation_fraction)

    models: dict[str, dict] = {}
    q, step = config.quantile, config.step_s
    H = config.horizons_s
    lgb_test, lgb_valid = lgbm_outputs(bundle, test.X), lgbm_outputs(bundle, valid.X)
    lgb_returns = return_thresholds(valid, lgb_valid, H, step)
    models["lightgbm"] = score(test, lgb_test, bundle.alarm_threshold, H, q, step, lgb_returns)
    # MAE is minimised by the median, not the mean: the same model's median as the point forecast
    models["lightgbm-median"] = score(test, median_outputs(bundle, lgb_test), bundle.alarm_threshold, H, q, step,
                                      lgb_returns)
    for f in forecasters:
        out_valid = poisson_outputs(valid.baselines[f.name], valid.threshold, q)
        out_test = poisson_outputs(test.baselines[f.name], test.threshold, q)
        models[f.name] = score(test, out_test, alarm_thresholds(valid, out_valid, step), H, q, step,
                               return_thresholds(valid, out_valid, H, step))
    latency = forecast_latency(bundle, counts.step_s)
    report = {"trace": path.name, "load_average_1m": os.getloadavg()[0], "family": args.family, "quick": args.quick,
              "requests": len(requests),
              "families": len(counts.families), "train_rows": len(result.rows), "test_rows": len(test),
              "train_s": bundle.train_s, "train_cpu_s": bundle.extra["train_cpu_s"], "features_s": result.features_s,
              "fit_s": result.fit_s, "trees": [b.num_trees() for b in bundle.boosters["count"]],
              "dispersion": bundle.dispersion, "time_of_day": bundle.spec.time_of_day,
              "forecast_ms_1": latency["forecast_ms_1"], "forecast_ms_10k": latency["forecast_ms_10k"],
              "ceiling_predict_ms_10k": latency["ceiling_predict_ms_10k"],
              "season_steps": next(f.period for f in forecasters if isinstance(f, SeasonalNaive)),
              "models": models}
    _print(report, config.horizons_s)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


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


def _baselines(config, train: FamilyCounts) -> list:
    b = config.baselines
    total = train.total()
    period = SeasonalNaive.fit_period(total, round(float(b["max_season_s"]) / config.step_s))
    pooled = total / max(1, len(train.families))
    arima = Arima(tuple(b["arima_order"])).fit(pooled)
    return [LastValue(config.spec), Ewma(config.spec, float(b["ewma_halflife_s"])), SeasonalNaive(period), arima]


def _print(report: dict, horizons: tuple[float, ...]) -> None:
    print(f"\n{'model':<15}{'h':>4}{'MAE':>9}{'RMSE':>9}{'pinball':>9}{'prec':>7}{'recall':>7}{'F1':>7}"
          f"{'lead s':>7}{'bursts':>7} | returns:{'prec':>6}{'recall':>7}{'F1':>7}{'n':>6}")
    fmt = lambda v: "   -" if v is None else f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
    for name, per in report["models"].items():
        for h in horizons:
            m = per[f"h{h:g}"]
            print(f"{name:<15}{h:>4g}{m['mae']:>9.4f}{m['rmse']:>9.4f}{m['pinball']:>9.4f}{fmt(m['burst_precision']):>7}"
                  f"{fmt(m['burst_recall']):>7}{fmt(m['burst_f1']):>7}{fmt(m['lead_time_s']):>7}"
                  f"{m['burst_episodes']:>7} |         {fmt(m['return_precision']):>6}{fmt(m['return_recall']):>7}"
                  f"{fmt(m['return_f1']):>7}{m['return_episodes']:>6}")
    print(f"\ntrain_s {report['train_s']:.2f} (features {report['features_s']:.2f}, fit {report['fit_s']:.2f}; "
          f"CPU {report['train_cpu_s']:.2f} s); "
          f"forecast ms: 1 family {report['forecast_ms_1']:.2f}, 10k families {report['forecast_ms_10k']:.2f} "
          f"(ceiling: raw Booster.predict on 10k rows {report['ceiling_predict_ms_10k']:.2f}); "
          f"1-min load average at the end {report['load_average_1m']:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], {}))
