"""Training from arrival counts: the fixed config and the one training path
that the benchmark and the online retrainer share.

Config: services/config/predictor.json (hyperparameters fixed before any
reported rows were looked at; `quick` overrides for a fast run). Training
rows are the tracked (family, step) rows whose whole horizon lies inside the
data; the newest validation_fraction of their steps is the validation slice
(early stopping, alarm thresholds, the served point forecast's choice:
point_fit.py), the rest trains.

The level-free boosters also train on binomially thinned copies of the
counts (level_free.py), cut at the real rows' validation step so that no
copy of a validation step is trained on.

The burst classifiers (burst_model.py, config `burst`) train on the same
rows as the count boosters; the validation slice chooses, per horizon,
whether they or the count distribution serve the burst probability.

The seasonal baseline's period is fitted on the counts trained on (the
cluster total's autocorrelation, baselines.SeasonalNaive.fit_period, as the
benchmark's baseline does), and the lags it reads join the feature lags so
the served model can offer it as a candidate.
"""
from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from speckv.services.common.config import CONFIG_DIR
from speckv.services.predictor.fitting.baselines import SeasonalNaive
from speckv.services.predictor.fitting.burst_model import fit_burst
from speckv.services.predictor.fitting.dataset import BlockForecaster, Rows, build_rows
from speckv.services.predictor.fitting.family_counts import FamilyCounts
from speckv.services.predictor.fitting.lgbm_forecaster import train_bundle
from speckv.services.predictor.fitting.point_fit import PointConfig, fit_point
from speckv.services.predictor.serving.feature_baselines import FeatureBaselines, season_lags
from speckv.services.predictor.serving.feature_spec import FeatureSpec, periodic_features_usable
from speckv.services.predictor.serving.lgbm_bundle import LgbmBundle
from speckv.services.predictor.serving.targets import horizon_steps

CONFIG_PATH = CONFIG_DIR / "predictor.json"


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    step_s: float
    horizons_s: tuple[float, ...]
    quantile: float
    track_s: float
    validation_fraction: float
    spec: FeatureSpec
    lightgbm: Mapping[str, Any]
    baselines: Mapping[str, Any]
    point: Mapping[str, Any] = field(default_factory=dict)  # empty: serve the count booster's mean
    burst: Mapping[str, Any] = field(default_factory=dict)  # empty: no burst classifiers (burst_model.py)


def load_config(path: str | Path | None = None, quick: bool = False, tod_offset_s: float = 0.0) -> TrainingConfig:
    raw = json.loads(Path(path or CONFIG_PATH).read_text(encoding="utf-8"))
    if quick:
        raw = _merge(raw, raw.get("quick", {}))
    spec = FeatureSpec.from_dict({**raw["features"], "step_s": float(raw["step_s"]), "tod_offset_s": tod_offset_s})
    return TrainingConfig(float(raw["step_s"]), tuple(float(h) for h in raw["horizons_s"]), float(raw["quantile"]),
                          float(raw["track_s"]), float(raw["validation_fraction"]), spec, raw["lightgbm"],
                          raw["baselines"], raw.get("point", {}), raw.get("burst", {}))


def at_step(config: TrainingConfig, step_s: float) -> TrainingConfig:
    """config on bins of step_s seconds, each horizon rounded up to a whole
    number of them (duplicates dropped): for a trace whose timestamps are
    coarser than config.step_s, no bin or horizon finer than its data."""
    if step_s <= config.step_s:
        return config
    horizons = sorted({step_s * max(1, math.ceil(h / step_s - 1e-9)) for h in config.horizons_s})
    return replace(config, step_s=float(step_s), horizons_s=tuple(float(h) for h in horizons),
                   spec=replace(config.spec, step_s=float(step_s)))


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def split_validation(rows: Rows, fraction: float) -> tuple[Rows, Rows]:
    """(train, validation): validation holds the newest `fraction` of steps."""
    if not len(rows):
        return rows, rows
    late = rows.step > validation_cut(rows, fraction)
    return rows.take(np.flatnonzero(~late)), rows.take(np.flatnonzero(late))


def validation_cut(rows: Rows, fraction: float) -> float:
    """The step after which rows are validation (rows not empty)."""
    lo, hi = int(rows.step.min()), int(rows.step.max())
    return hi - (hi - lo) * fraction


def thin(counts: FamilyCounts, keep: float, seed: int) -> FamilyCounts:
    """counts with each arrival kept with probability `keep` (binomial
    thinning, seeded): the same traffic's timing at a lower level. Families
    left without arrivals are dropped (a tracked family has one)."""
    c = counts.counts.copy()
    c.data = np.random.default_rng(seed).binomial(c.data.astype(np.int64), keep).astype(np.float64)
    c.eliminate_zeros()
    kept = np.flatnonzero(np.diff(c.indptr) > 0)
    return FamilyCounts([counts.families[i] for i in kept], c[kept].tocsr(), counts.step_s, counts.start_s)


@dataclass(slots=True)
class TrainResult:
    bundle: LgbmBundle
    rows: Rows  # every training row (train + validation)
    validation: Rows
    features_s: float
    fit_s: float


def train_on_counts(counts: FamilyCounts, config: TrainingConfig,
                    forecasters: Sequence[BlockForecaster] = ()) -> TrainResult:
    """Builds rows from counts, trains every booster; seconds measured.
    Time-of-day terms are dropped when the counts span too little time for
    them to generalise (features.periodic_features_usable)."""
    usable = periodic_features_usable(counts.steps * counts.step_s)
    spec = replace(config.spec, step_s=counts.step_s, time_of_day=config.spec.time_of_day and usable)
    began, cpu = time.perf_counter(), time.process_time()
    baselines = None
    if config.point:
        b = config.baselines
        period = SeasonalNaive.fit_period(counts.total(), round(float(b["max_season_s"]) / counts.step_s))
        lags = season_lags(period, horizon_steps(config.horizons_s, counts.step_s))
        spec = replace(spec, lags=tuple(sorted(set(spec.lags) | set(lags))))
        baselines = FeatureBaselines(spec, float(b["ewma_halflife_s"]), period)
    rows = build_rows(counts, spec, config.horizons_s, config.track_s, forecasters)
    built = time.perf_counter()
    train, validation = split_validation(rows, config.validation_fraction)
    bundle = train_bundle(train, validation, spec, config.horizons_s, config.quantile, config.lightgbm,
                          counts.step_s)
    if baselines is not None:
        point = PointConfig.from_dict(config.point)
        seed = int(config.lightgbm.get("seed", 0))
        thinned: list[Rows] = []  # built here, so inside fit_s: training rows only, cut where the real rows are
        for j, keep in enumerate(point.thinning if len(rows) else ()):
            copy_rows = build_rows(thin(counts, keep, seed + j), spec, config.horizons_s, config.track_s)
            thinned.append(copy_rows.take(np.flatnonzero(
                copy_rows.step <= validation_cut(rows, config.validation_fraction))))
        fit_point(bundle, train, validation, baselines, point, config.lightgbm, thinned)
    fit_burst(bundle, train, validation, config.burst, config.lightgbm)
    done = time.perf_counter()
    bundle.train_s = done - began
    bundle.extra["train_cpu_s"] = time.process_time() - cpu  # this process's CPU: the work, without waits for cores
    return TrainResult(bundle, rows, validation, built - began, done - built)
