"""FeatureSpec: the parameters of a family's features (features.py), the
names they derive in order, and the checks a spec read from a manifest
passes; periodic_features_usable, the one rule for periodic terms."""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from speckv.services.predictor.serving.trend import sum_spans, trend_names

RATIO_EPS = 1e-3
NEVER = np.iinfo(np.int64).min // 4
SECONDS_PER_DAY = 86_400.0
# A periodic feature generalises only when training saw each phase this many times.
MIN_PERIODS = 2.0
# OnlineFeatures._peaks reduces every row's window maxima in place, rather than gathering the rows
# asked, from this fraction of the capacity asked on (docs/predictor.md, "Where the time goes").
WHOLE_FRACTION = 1 / 32


def periodic_features_usable(history_s: float, period_s: float = SECONDS_PER_DAY) -> bool:
    """The one rule for periodic features: usable when the training history
    covers MIN_PERIODS periods (a 1-hour trace never shows a time of day twice)."""
    return history_s >= MIN_PERIODS * period_s


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """Feature parameters. Windows and lags in steps, half-lives in seconds."""

    step_s: float = 1.0
    lags: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 10)
    windows: tuple[int, ...] = (3, 5, 10, 30, 60, 300)
    halflives_s: tuple[float, ...] = (2.0, 10.0, 60.0)
    long_halflife_s: float = 120.0
    burst_ratio: float = 3.0
    min_burst_count: float = 5.0
    burst_span: int = 5
    cluster_halflives_s: tuple[float, ...] = (10.0, 60.0)
    # Empty by default so that a model saved before trend features existed derives its own names.
    trend_spans: tuple[int, ...] = ()
    cap_s: float = 3600.0
    turn_cap: float = 64.0
    tod_offset_s: float = 0.0
    time_of_day: bool = True

    @property
    def ring(self) -> int:
        """Steps of raw history the incremental form keeps per row."""
        return max(max(self.lags), max(self.windows), self.burst_span, *sum_spans(self.trend_spans))

    def names(self) -> tuple[str, ...]:
        return _names(self)

    def column(self, name: str) -> int:
        """Index of feature `name` in names(); KeyError when it is not one."""
        return _columns(self)[name]

    def _derive_names(self) -> tuple[str, ...]:
        out = [f"lag_{k}" for k in self.lags]
        for w in self.windows:
            out += [f"mean_{w}", f"max_{w}", f"std_{w}"]
        out += [f"ewma_hl{h:g}s" for h in self.halflives_s]
        out.append(f"level_hl{self.long_halflife_s:g}s")
        out += [f"ratio_hl{h:g}s" for h in self.halflives_s]
        out += ["since_burst_s", "since_arrival_s", "turns", "cluster_lag_1"]
        out += [f"cluster_ewma_hl{h:g}s" for h in self.cluster_halflives_s]
        out += trend_names(self.trend_spans)
        if self.time_of_day:
            out += ["tod_sin", "tod_cos"]
        return tuple(out)

    def decay(self, halflife_s: float) -> float:
        return 2.0 ** (-self.step_s / halflife_s)

    def validate(self) -> None:
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ValueError(f"step_s={self.step_s}: must be > 0")
        for name in ("lags", "windows"):
            if not getattr(self, name) or min(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: need at least one, each >= 1 step")
        if self.burst_span < 1:
            raise ValueError(f"burst_span={self.burst_span}: must be >= 1")
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in self.trend_spans):
            raise ValueError(f"trend_spans={list(self.trend_spans)}: each must be an integer >= 1 step")
        if len(set(self.trend_spans)) != len(self.trend_spans):
            raise ValueError(f"trend_spans={list(self.trend_spans)}: each span once")

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "FeatureSpec":
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown feature parameter")
        defaults = cls()
        for key, value in values.items():
            _check_type(key, value, getattr(defaults, key))
        out = {k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items()}
        spec = cls(**out)
        spec.validate()
        return spec


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_type(key: str, value: Any, default: Any) -> None:
    """ValueError unless value has the type of the field's default (a
    manifest's feature_spec: a wrong type would pass validate() and fail
    only when online features are computed)."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = _is_number(value)
    else:  # a tuple: a list of numbers (integers where the field's are)
        whole = all(isinstance(v, int) for v in default)
        ok = isinstance(value, list) and all(
            _is_number(v) and (not whole or isinstance(v, int)) for v in value)
    if not ok:
        raise ValueError(f"{key}={value!r}: must be {_type_name(default)}")


def _type_name(default: Any) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a finite number"
    return "a list of integers" if all(isinstance(v, int) for v in default) else "a list of finite numbers"


# A spec is frozen and hashable: its names are derived once (serving asks for them on every forecast).
@functools.lru_cache(maxsize=64)
def _names(spec: FeatureSpec) -> tuple[str, ...]:
    return spec._derive_names()


@functools.lru_cache(maxsize=64)
def _columns(spec: FeatureSpec) -> dict[str, int]:
    return {name: i for i, name in enumerate(_names(spec))}
