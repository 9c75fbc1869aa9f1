"""Choosing the recalibration's parameters on data before the evaluated slice.

validate_recalibration(rows, ...) never reads a row ending at or after
until_s (the start of the evaluated slice) nor an arrival after it: rows are
cut there and every return delay that reaches past it is censored (+inf), so
the evaluated slice cannot steer the choice. For each cut C in cuts (seconds,
< until_s): a model is trained on the turn ends before C (labels censored at
C, model.train_return_model), it predicts every row before until_s, the
recalibration replays them (recalibration.recalibrate_rows) and the
validation rows, ends in [C, until_s) whose horizon window closed by until_s,
are scored with and without it (evaluation.score).

The choice (choose): the spec with the lowest mean Brier score over every
(cut, horizon) that has validation rows; it is kept only if it beats no
recalibration on that mean and does not worsen the mean ECE at the
calibration horizon. Otherwise recalibration stays off.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from speckv.services.predictor.fitting.returns.dataset import ReturnRows
from speckv.services.predictor.fitting.returns.model_training import train_return_model
from speckv.services.predictor.judging.returns import evaluation
from speckv.services.predictor.serving.returns.recalibration import RecalibrationSpec, recalibrate_rows

# What `speckv bench returns --tune-recalibration` searches (seconds, pseudo-rows, logit units): cuts before
# the Mooncake conversation trace's evaluated slice (2,476 s), so each leaves 476-976 s of validation rows.
DEFAULT_CUTS_S = (1500.0, 1800.0, 2000.0)
DEFAULT_GRID = tuple(RecalibrationSpec(True, w, k, m) for w, k, m in itertools.product(
    (300.0, 600.0, 900.0, 1200.0, 1800.0), (20.0, 50.0, 200.0, 800.0), (0.5, 1.0)))


@dataclass(slots=True)
class Candidate:
    """One spec's validation scores: per cut, per horizon key "h<t>", evaluation.score."""

    spec: RecalibrationSpec | None  # None: no recalibration
    scores: dict[float, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def mean(self, metric: str, horizons: Sequence[str] | None = None) -> float:
        values = [m[metric] for per in self.scores.values() for h, m in per.items()
                  if (horizons is None or h in horizons) and m["rows"] and not math.isnan(m[metric])]
        return float(np.mean(values)) if values else math.nan


def validate_recalibration(rows: ReturnRows, horizons_s: Sequence[float], until_s: float, cuts: Sequence[float],
                           params: Mapping[str, Any], validation_fraction: float,
                           grid: Sequence[RecalibrationSpec]) -> list[Candidate]:
    """[no recalibration, *grid] scored on each cut's validation rows (module docstring)."""
    if any(c >= until_s for c in cuts):
        raise ValueError(f"cuts {list(cuts)} must lie before until_s={until_s}")
    before = rows.take(np.flatnonzero(rows.end_s < until_s))
    delay = np.where(before.end_s + before.delay_s <= until_s, before.delay_s, math.inf)  # nothing past until_s
    H = tuple(float(h) for h in horizons_s)
    known, labels = before.known(H, until_s), before.labels(H)
    candidates = [Candidate(None), *(Candidate(spec) for spec in grid)]
    for cut in cuts:
        train = before.take(np.flatnonzero(before.end_s < cut))
        model = train_return_model(train, H, cut, params, validation_fraction)
        cdf = model.predict_cdf(before.X)
        valid = before.end_s >= cut
        for candidate in candidates:
            p = cdf if candidate.spec is None else recalibrate_rows(before.end_s, delay, cdf, H, candidate.spec)[0]
            candidate.scores[cut] = {f"h{h:g}": evaluation.score(p[valid & known[:, i], i],
                                                                labels[valid & known[:, i], i])
                                     for i, h in enumerate(H)}
    return candidates


def choose(candidates: Sequence[Candidate], calibration_horizon_s: float) -> Candidate:
    """The rule of the module docstring; candidates[0] is no recalibration."""
    off = candidates[0]
    key = [f"h{calibration_horizon_s:g}"]
    best = min(candidates[1:], key=lambda c: c.mean("brier"), default=off)
    if best is off or not (best.mean("brier") < off.mean("brier") and best.mean("ece", key) <= off.mean("ece", key)):
        return off
    return best
