"""One LightGBM binary classifier per horizon: P(next turn within t of the
end), as served (ReturnModel) with each horizon's training record
(HorizonFit). How it is trained, censored and validated:
fitting/returns/model_training.py.

Serving: predict_cdf gives the horizon probabilities made monotone (running
maximum over horizons, survival.monotone); expected_s the expected return
time E[min(T, t_n)] from that curve (survival.expected_time); past the last
horizon the Kaplan-Meier tail (tail). Conditional forms for conversations
already idle for a while live in survival.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import lightgbm as lgb
import numpy as np

from speckv.services.predictor.serving.returns import survival


@dataclass(slots=True)
class HorizonFit:
    """What training saw for one horizon (row counts and base rate)."""

    horizon_s: float
    train_rows: int
    validation_rows: int
    base_rate: float  # positives / usable rows (train + validation); NaN without rows
    trees: int
    validation_auc: float  # of the booster on its validation slice; NaN without one


@dataclass(slots=True)
class ReturnModel:
    """Boosters (None: constant base rate) per horizon, in horizons_s order."""

    horizons_s: tuple[float, ...]
    feature_names: tuple[str, ...]
    boosters: list[lgb.Booster | None]
    fits: list[HorizonFit]
    tail: survival.Tail | None = None
    train_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def predict_raw(self, X: np.ndarray, num_threads: int = 1) -> np.ndarray:
        """Per-horizon probabilities as the boosters give them, (N, H) float64."""
        X = np.ascontiguousarray(np.atleast_2d(X), dtype=np.float64)
        if X.shape[1] != len(self.feature_names):
            raise ValueError(f"X has {X.shape[1]} columns, the model {len(self.feature_names)}")
        out = np.empty((len(X), len(self.horizons_s)))
        for i, booster in enumerate(self.boosters):
            if booster is None:
                rate = self.fits[i].base_rate
                out[:, i] = 0.0 if math.isnan(rate) else rate
            elif len(X):
                out[:, i] = booster.predict(X, num_threads=num_threads)
        return out

    def predict_cdf(self, X: np.ndarray, num_threads: int = 1) -> np.ndarray:
        """P(return within t_i of the end), monotone in i, (N, H)."""
        return survival.monotone(self.predict_raw(X, num_threads))

    def expected_s(self, X: np.ndarray, num_threads: int = 1) -> np.ndarray:
        """E[min(T, t_n)] seconds from the end, (N,)."""
        return survival.expected_time(self.predict_cdf(X, num_threads), self.horizons_s)
