"""The `session_return` section of services/config/predictor.json: horizons,
split fractions, the offline service-time model, feature and tracker limits,
baseline buckets, the fixed LightGBM hyperparameters (`quick` overrides a
few for a fast run), the online level recalibration (recalibration.py;
absent: off) and online learning's thresholds (`online`: OnlineSettings,
fitting/returns/online.py; absent: the defaults, and off unless a caller
switches it on). Read from a file the caller names (default: the
committed one); never from the environment.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from speckv.services.common.config import CONFIG_DIR
from speckv.services.predictor.fitting.returns.turns import LinearServiceModel
from speckv.services.predictor.serving.returns.features import ReturnFeatureSpec
from speckv.services.predictor.serving.returns.recalibration import RecalibrationSpec

CONFIG_PATH = CONFIG_DIR / "predictor.json"
SECTION = "session_return"


@dataclass(frozen=True, slots=True)
class TrackerLimits:
    max_open_conversations: int = 100_000
    max_idle_s: float = 3_600.0  # an open conversation idle longer is dropped from forecasts


@dataclass(frozen=True, slots=True)
class OnlineSettings:
    """Seconds on the caller's clock. Invariants (validate): counts >= 1,
    times > 0, holdout_fraction in (0, 1), tolerance >= 0."""

    min_turn_ends: int = 500
    min_history_s: float = 600.0
    window_s: float = 3600.0
    refit_interval_s: float = 300.0
    holdout_fraction: float = 0.2
    min_holdout_rows: int = 50
    tolerance: float = 0.0
    max_turn_ends: int = 200_000

    def validate(self) -> None:
        for name in ("min_history_s", "window_s", "refit_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"online.{name}={value}: must be finite and > 0")
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f"online.holdout_fraction={self.holdout_fraction}: must be in (0, 1)")
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ValueError(f"online.tolerance={self.tolerance}: must be finite and >= 0")
        for name in ("min_turn_ends", "min_holdout_rows", "max_turn_ends"):
            if getattr(self, name) < 1:
                raise ValueError(f"online.{name}={getattr(self, name)}: must be >= 1")
        if self.min_history_s > self.window_s:
            raise ValueError(f"online.min_history_s={self.min_history_s:g} exceeds window_s={self.window_s:g}")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> "OnlineSettings":
        """The `online` subsection (absent: the defaults); unknown keys are refused."""
        raw = dict(raw or {})
        names = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(raw) - set(names) - {"about"})
        if unknown:
            raise ValueError(f"{SECTION}.online: unknown keys {unknown}")
        values = {k: (int(v) if names[k] == "int" else float(v)) for k, v in raw.items() if k in names}
        settings = cls(**values)
        settings.validate()
        return settings


@dataclass(frozen=True, slots=True)
class ReturnConfig:
    horizons_s: tuple[float, ...]
    eval_fraction: float  # newest share of the trace's time that is evaluated
    validation_fraction: float  # newest share of the training rows' time for early stopping
    service: LinearServiceModel
    features: ReturnFeatureSpec
    tracker: TrackerLimits
    turn_edges: tuple[float, ...]
    gap_edges_s: tuple[float, ...]
    prior_rows: float
    lightgbm: Mapping[str, Any]
    recalibration: RecalibrationSpec = RecalibrationSpec()
    online: OnlineSettings = OnlineSettings()  # online learning (online.py); used only where it is switched on

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "ReturnConfig":
        horizons = tuple(float(h) for h in raw["horizons_s"])
        eval_fraction, validation_fraction = float(raw["eval_fraction"]), float(raw["validation_fraction"])
        for name, value in (("eval_fraction", eval_fraction), ("validation_fraction", validation_fraction)):
            if not 0.0 < value < 1.0:
                raise ValueError(f"{SECTION}.{name}={value}: must be in (0, 1)")
        tracker = raw.get("tracker", {})
        limits = TrackerLimits(int(tracker.get("max_open_conversations", 100_000)),
                               float(tracker.get("max_idle_s", 3_600.0)))
        if limits.max_open_conversations < 1 or limits.max_idle_s <= 0:
            raise ValueError(f"{SECTION}.tracker: max_open_conversations >= 1 and max_idle_s > 0")
        baselines = raw.get("baselines", {})
        try:
            recalibration = RecalibrationSpec.from_dict(raw.get("recalibration"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{SECTION}.{exc}") from None
        return cls(horizons, eval_fraction, validation_fraction,
                   LinearServiceModel(**{k: float(v) for k, v in raw.get("service_model", {}).items()}),
                   ReturnFeatureSpec.from_dict(raw.get("features", {}), horizons), limits,
                   tuple(float(e) for e in baselines.get("turn_edges", (1, 2, 3, 5))),
                   tuple(float(e) for e in baselines.get("gap_edges_s", (30, 60, 120, 300, 600))),
                   float(baselines.get("prior_rows", 10.0)), dict(raw["lightgbm"]), recalibration,
                   OnlineSettings.from_dict(raw.get("online")))


def load_return_config(path: str | Path | None = None, quick: bool = False) -> ReturnConfig:
    raw = json.loads(Path(path or CONFIG_PATH).read_text(encoding="utf-8"))
    if SECTION not in raw:
        raise KeyError(f"{path or CONFIG_PATH}: no {SECTION!r} section")
    section = raw[SECTION]
    if quick:
        section = _merge(section, section.get("quick", {}))
    return ReturnConfig.from_dict(section)


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out
