"""One workload through `speckv bench predictor`: train on its first 70 %,
score every model on the rest, measure the forecast latency; a report dict.

A workload is a list of requests (a shared trace, or a synthetic scenario's
generated requests) and a time-of-day offset. Bins: the config's step_s,
unless the workload's timestamps are coarser (the RESOLUTION_QUANTILE
percentile of gaps between distinct timestamps; the Mooncake conversation
trace arrives in batches every ~3 s): then bins of that resolution rounded
up to whole config steps, each horizon rounded up to whole bins, so no bin
or horizon is finer than the data. Hyperparameters come from
services/config/predictor.json, fixed; nothing is tuned on the reported rows.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speckv.loadgen.bench.predictor.evaluation import (
    alarm_thresholds,
    candidate_outputs,
    lgbm_outputs,
    poisson_floor,
    poisson_outputs,
    return_thresholds,
    score,
)
from speckv.loadgen.bench.predictor.latency import forecast_latency
from speckv.services.common.traces import TraceRequest
from speckv.services.predictor.fitting.baselines import Ewma, LastValue, SeasonalNaive
from speckv.services.predictor.fitting.dataset import build_rows
from speckv.services.predictor.fitting.family_counts import FamilyCounts, aggregate
from speckv.services.predictor.fitting.training import TrainingConfig, at_step, split_validation, train_on_counts
from speckv.services.predictor.judging.arima import Arima
from speckv.services.predictor.serving.feature_baselines import NAMES as SERVABLE_BASELINES
from speckv.services.predictor.serving.feature_spec import FeatureSpec
from speckv.services.predictor.serving.lgbm_bundle import MODEL_CANDIDATES

TRAIN_FRACTION = 0.7
# Timestamp resolution: a low percentile of the gaps between distinct arrival times. Unquantised traces
# have some near-simultaneous arrivals (gaps of ms); a trace stamped in batches has none below its period.
RESOLUTION_QUANTILE = 1.0


@dataclass(frozen=True, slots=True)
class Workload:
    """What one report is about: name (a trace file name or synthetic:<scenario>), the
    requests in arrival order, and where they came from (printed with the report)."""

    name: str
    requests: Sequence[TraceRequest]
    source: str


def timestamp_resolution_s(times_s: np.ndarray) -> float:
    """The RESOLUTION_QUANTILE percentile of the gaps between consecutive
    distinct arrival times, seconds (0 with fewer than two)."""
    distinct = np.unique(np.asarray(times_s, dtype=np.float64))
    if len(distinct) < 2:
        return 0.0
    return float(np.percentile(np.diff(distinct), RESOLUTION_QUANTILE))


def evaluate(workload: Workload, config: TrainingConfig, family: str, quick: bool, latency: bool = True) -> dict:
    """The report of one workload (the keys `speckv bench predictor --json` writes)."""
    began = time.perf_counter()
    times = np.array([r.arrival_s for r in workload.requests])
    resolution = timestamp_resolution_s(times)
    config = at_step(config, config.step_s * max(1, math.ceil(resolution / config.step_s - 1e-6)))
    counts = aggregate(times, [r.family for r in workload.requests], config.step_s)
    split = int(TRAIN_FRACTION * counts.steps)
    train_counts = _active(FamilyCounts(counts.families, counts.counts[:, :split].tocsr(), counts.step_s,
                                        counts.start_s))
    print(f"\n== {workload.name}: {len(workload.requests)} requests, {len(counts.families)} families, {counts.steps} "
          f"steps of {counts.step_s:g} s (timestamp resolution {resolution:.3g} s), horizons "
          f"{[f'{h:g}' for h in config.horizons_s]} s; train on steps < {split}, report on the rest "
          f"({workload.source})", flush=True)

    result = train_on_counts(train_counts, config)  # timed: exactly what a retrain does
    bundle = result.bundle
    forecasters = _baselines(config, bundle.spec, train_counts)  # the bundle's feature columns
    print(f"trained on {len(result.rows)} rows: features {result.features_s:.1f} s, fit {result.fit_s:.1f} s; "
          f"{len(bundle.spec.names())} features (time of day {'kept' if bundle.spec.time_of_day else 'dropped'}), "
          f"trees per horizon {[b.num_trees() for b in bundle.boosters['count']]}", flush=True)
    test = build_rows(counts, bundle.spec, config.horizons_s, config.track_s, forecasters)
    test = test.take(np.flatnonzero(test.step >= split))
    # the baselines' alarm thresholds come from the same validation slice, built again with them (untimed)
    _, valid = split_validation(build_rows(train_counts, bundle.spec, config.horizons_s, config.track_s,
                                           forecasters), config.validation_fraction)
    models = _scores(bundle, forecasters, test, valid, config)
    floor = poisson_floor(test, counts, config.horizons_s)
    timing = forecast_latency(bundle, counts.step_s) if latency else None
    H = config.horizons_s
    return {"trace": workload.name, "source": workload.source, "load_average_1m": os.getloadavg()[0],
            "family": family, "quick": quick, "requests": len(workload.requests),
            "timestamp_resolution_s": resolution, "step_s": config.step_s, "horizons_s": list(H),
            "families": len(counts.families), "train_rows": len(result.rows), "test_rows": len(test),
            "train_s": bundle.train_s, "train_cpu_s": bundle.extra["train_cpu_s"], "features_s": result.features_s,
            "fit_s": result.fit_s, "trees": {k: [b.num_trees() for b in v] for k, v in bundle.boosters.items()},
            "dispersion": bundle.dispersion, "time_of_day": bundle.spec.time_of_day,
            "forecast_ms_1": timing["forecast_ms_1"] if timing else None,
            "forecast_ms_10k": timing["forecast_ms_10k"] if timing else None, "latency": timing,
            "season_steps": next(f.period for f in forecasters if isinstance(f, SeasonalNaive)),
            "choices": [c.to_dict() for c in bundle.selection.choices] if bundle.selection else [],
            "burst_choice": bundle.burst.to_dict() if bundle.burst is not None else None,
            "summary": _summary(models, floor, H), "models": models, "wall_s": time.perf_counter() - began}


def _scores(bundle, forecasters: list, test, valid, config: TrainingConfig) -> dict[str, dict]:
    """Every model's scores on the test rows; alarm thresholds from the validation rows."""
    models: dict[str, dict] = {}
    q, step, spec, H = config.quantile, bundle.spec.step_s, bundle.spec, config.horizons_s
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
    return models


def _summary(models: dict[str, dict], floor: np.ndarray, horizons: tuple[float, ...]) -> dict[str, dict]:
    """Per horizon: the served MAE (mean and median absolute error), the best
    baseline (all of them, ARIMA too) and the best servable one, their
    ratios, the Poisson floor, and the served burst alarms."""
    out: dict[str, dict] = {}
    for i, h in enumerate(horizons):
        key = f"h{h:g}"
        served = models["served"][key]
        baselines = {n: m[key]["mae"] for n, m in models.items() if n in (*SERVABLE_BASELINES, "arima")}
        best = min(baselines, key=baselines.get)
        servable = min((n for n in baselines if n in SERVABLE_BASELINES), key=baselines.get)
        out[key] = {"served_mae": served["mae"], "served_median_ae": served["median_ae"], "best_baseline": best,
                    "best_baseline_mae": baselines[best],
                    "ratio": served["mae"] / baselines[best] if baselines[best] > 0 else math.nan,
                    "best_servable_baseline": servable, "best_servable_mae": baselines[servable],
                    "ratio_servable": served["mae"] / baselines[servable] if baselines[servable] > 0 else math.nan,
                    "poisson_floor_mae": float(floor[i]),
                    **{k: served[k] for k in ("burst_precision", "burst_recall", "lead_time_s", "lead_mean_s",
                                              "burst_early", "burst_episodes")}}
    return out


def _active(counts: FamilyCounts) -> FamilyCounts:
    """Only the families that arrived in the training part."""
    keep = np.flatnonzero(np.diff(counts.counts.indptr) > 0)
    return FamilyCounts([counts.families[i] for i in keep], counts.counts[keep], counts.step_s, counts.start_s)


def _baselines(config: TrainingConfig, spec: FeatureSpec, train: FamilyCounts) -> list:
    """The bench's baselines over rows of `spec` (the trained bundle's: its
    lags include the seasonal ones). The period is the one training fitted."""
    b = config.baselines
    total = train.total()
    period = SeasonalNaive.fit_period(total, round(float(b["max_season_s"]) / config.step_s))
    pooled = total / max(1, len(train.families))
    arima = Arima(tuple(b["arima_order"])).fit(pooled)
    return [LastValue(spec), Ewma(spec, float(b["ewma_halflife_s"])), SeasonalNaive(period), arima]
