"""The baselines' forecasts read off a feature row, so the served model can
offer them as candidates (selection.py) with nothing but the features it
already has.

For a row (family f, end of step s) and a horizon of k steps:
- last-value: lag_1 * k (the count of step s, repeated);
- ewma: ewma_hl<h>s * k (the exposure-corrected EWMA count per step);
- seasonal-naive, period P steps: step s + j repeats step
  s + j - P * ceil(j / P), that is lag l = P * ceil(j / P) - j + 1 (1 <= l <= P),
  so the count over the horizon is sum_l n_l(k) * lag_l, n_l(k) the number
  of j in 1..k that repeat lag l.
Invariant: each equals, value for value, the block baseline of the same name
in baselines.py on the same history (the same counts, the same float32
feature column), so the bench's baseline rows and the served candidates are
one forecast. The seasonal one needs lag_l among the features for every l
it reads (`season_lags`); training adds them (at most max(k) lags).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from speckv.services.predictor.serving.feature_spec import FeatureSpec

LAST_VALUE = "last-value"
EWMA = "ewma"
SEASONAL_NAIVE = "seasonal-naive"
NAMES = (LAST_VALUE, EWMA, SEASONAL_NAIVE)


def season_counts(period_steps: int, k: int) -> dict[int, int]:
    """lag -> how many of the k steps ahead repeat it (seasonal naive)."""
    if period_steps < 1 or k < 1:
        raise ValueError(f"period_steps={period_steps}, k={k}: both must be >= 1")
    out: dict[int, int] = {}
    for j in range(1, k + 1):
        lag = period_steps * -(-j // period_steps) - j + 1
        out[lag] = out.get(lag, 0) + 1
    return out


def season_lags(period_steps: int, ks: Sequence[int]) -> tuple[int, ...]:
    """Every lag the seasonal forecast reads over horizons ks, sorted."""
    return tuple(sorted({lag for k in ks for lag in season_counts(period_steps, k)}))


@dataclass(frozen=True, slots=True)
class FeatureBaselines:
    """The baselines over feature rows of `spec`. ewma_halflife_s names the
    ewma_hl<h>s feature; period_steps 0 means no seasonal candidate."""

    spec: FeatureSpec
    ewma_halflife_s: float
    period_steps: int = 0
    # k -> the seasonal forecast's (columns, repeats), derived once: serving reads it on every forecast
    _plans: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, init=False, compare=False,
                                                             repr=False)

    def names(self) -> tuple[str, ...]:
        return NAMES if self.period_steps > 0 else NAMES[:2]

    def validate(self) -> None:
        """ValueError naming what the spec lacks."""
        names = self.spec.names()
        if f"ewma_hl{self.ewma_halflife_s:g}s" not in names:
            raise ValueError(f"ewma_halflife_s={self.ewma_halflife_s:g}: ewma_hl{self.ewma_halflife_s:g}s "
                             "is not a feature")
        if 1 not in self.spec.lags:
            raise ValueError("lags: lag 1 is needed by last-value")
        if self.period_steps < 0:
            raise ValueError(f"period_steps={self.period_steps}: must be >= 0")

    def forecast(self, name: str, X: np.ndarray, k: int) -> np.ndarray:
        """Count over k steps for each row of X, float64 (N,)."""
        spec = self.spec
        if name == LAST_VALUE:
            return X[:, spec.column("lag_1")].astype(np.float64) * k
        if name == EWMA:
            return X[:, spec.column(f"ewma_hl{self.ewma_halflife_s:g}s")].astype(np.float64) * k
        if name == SEASONAL_NAIVE and self.period_steps > 0:
            plan = self._plans.get(k)
            if plan is None:
                plan = self._plans[k] = self._season_plan(k)
            columns, times = plan
            # counts are small integers: the float64 sum is exact in any order, so it equals the block form's
            return X[:, columns].astype(np.float64) @ times
        raise ValueError(f"{name!r}: not a feature baseline (have {', '.join(self.names())})")

    def _season_plan(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(feature columns, repeats) of the seasonal forecast over k steps."""
        pairs = sorted(season_counts(self.period_steps, k).items())
        for lag, _ in pairs:
            if lag not in self.spec.lags:
                raise ValueError(f"seasonal-naive with period {self.period_steps} reads lag_{lag}, "
                                 "which is not a feature")
        return (np.array([self.spec.column(f"lag_{lag}") for lag, _ in pairs], dtype=np.int64),
                np.array([float(n) for _, n in pairs]))
