"""Training from arrival counts: the fixed config and the one training path
that the benchmark and the online retrainer share.

Config: services/config/predictor.json (hyperparameters fixed before any
reported rows were looked at; `quick` overrides for a fast run). Training
rows are the tracked (family, step) rows whose whole horizon lies inside the
data; the newest validation_fraction of their steps is the validation slice
(early stopping, alarm thresholds), the rest trains.
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from speckv.services.common.config import CONFIG_DIR
from speckv.services.predictor.dataset import BlockForecaster, Rows, build_rows
from speckv.services.predictor.family_counts import FamilyCounts
from speckv.services.predictor.features import FeatureSpec, periodic_features_usable
from speckv.services.predictor.lgbm_forecaster import LgbmBundle, train_bundle

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


def load_config(path: str | Path | None = None, quick: bool = False, tod_offset_s: float = 0.0) -> TrainingConfig:
    raw = json.loads(Path(path or CONFIG_PATH).read_text(encoding="utf-8"))
    if quick:
        raw = _merge(raw, raw.get("quick", {}))
    spec = FeatureSpec.from_dict({**raw["features"], "step_s": float(raw["step_s"]), "tod_offset_s": tod_offset_s})
    return TrainingConfig(float(raw["step_s"]), tuple(float(h) for h in raw["horizons_s"]), float(raw["quantile"]),
                          float(raw["track_s"]), float(raw["validation_fraction"]), spec, raw["lightgbm"],
                          raw["baselines"])


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def split_validation(rows: Rows, fraction: float) -> tuple[Rows, Rows]:
    """(train, validation): validation holds the newest `fraction` of steps."""
    if not len(rows):
        return rows, rows
    lo, hi = int(rows.step.min()), int(rows.step.max())
    cut = hi - (hi - lo) * fraction
    late = rows.step > cut
    return rows.take(np.flatnonzero(~late)), rows.take(np.flatnonzero(late))


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
    rows = build_rows(counts, spec, config.horizons_s, config.track_s, forecasters)
    built = time.perf_counter()
    train, validation = split_validation(rows, config.validation_fraction)
    bundle = train_bundle(train, validation, spec, config.horizons_s, config.quantile, config.lightgbm,
                          counts.step_s)
    done = time.perf_counter()
    bundle.train_s = done - began
    bundle.extra["train_cpu_s"] = time.process_time() - cpu  # this process's CPU: the work, without waits for cores
    return TrainResult(bundle, rows, validation, built - began, done - built)
