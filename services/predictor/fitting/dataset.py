"""Rows to train and judge on: features, future counts and burst labels of
every tracked (family, step), built block by block of families.

A family is tracked from its first arrival until track_s after its last (what
a live predictor holds), and a row exists only where every horizon's count is
known. Rows come sorted by family, then step. Count forecasters (the
baselines) run on the same blocks, so every model is judged on the very same
rows and horizons.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Protocol, Sequence

import numpy as np

from speckv.services.predictor.fitting.family_counts import FamilyCounts
from speckv.services.predictor.serving.feature_spec import FeatureSpec
from speckv.services.predictor.serving.features import batch_feature_rows, batch_features
from speckv.services.predictor.serving.targets import burst_threshold, future_counts, horizon_steps, onset_steps
from speckv.services.predictor.serving.trend import rising_counts

BLOCK_FAMILIES = 256


class BlockForecaster(Protocol):
    """A count model run over a block of families' whole series."""

    name: str

    def predict_block(self, counts: np.ndarray, features: np.ndarray, ks: Sequence[int]) -> np.ndarray:
        """Expected count over each horizon (ks steps) after each step:
        (rows, steps, horizons) float."""
        ...


@dataclass(slots=True)
class Rows:
    X: np.ndarray  # float32 (N, features)
    count: np.ndarray  # float32 (N, horizons)
    threshold: np.ndarray  # float32 (N, horizons)
    label: np.ndarray  # bool (N, horizons)
    onset: np.ndarray  # int16 (N, horizons), steps
    family: np.ndarray  # int32 (N,)
    step: np.ndarray  # int32 (N,)
    baselines: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (N, horizons)

    def __len__(self) -> int:
        return len(self.step)

    def take(self, index: np.ndarray) -> "Rows":
        parts = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "baselines"}
        out = {k: v[index] for k, v in parts.items()}
        return Rows(**out, baselines={k: v[index] for k, v in self.baselines.items()})


def build_rows(data: FamilyCounts, spec: FeatureSpec, horizons_s: Sequence[float], track_s: float,
               forecasters: Sequence[BlockForecaster] = (), block: int = BLOCK_FAMILIES) -> Rows:
    ks = horizon_steps(tuple(horizons_s), data.step_s)
    level_col = spec.names().index(f"level_hl{spec.long_halflife_s:g}s")
    total = data.total()
    T, kmax = data.steps, max(ks)
    first, last = data.first_steps(), data.last_steps()
    track = round(track_s / data.step_s)
    parts: list[Rows] = []
    steps = np.arange(T)
    rising = _rising(data, spec, block)
    for begin in range(0, len(data.families), block):
        end = min(begin + block, len(data.families))
        counts = data.dense(begin, end)
        mask = ((steps[None, :] >= first[begin:end, None]) & (steps[None, :] <= last[begin:end, None] + track)
                & (steps[None, :] + kmax <= T - 1))
        fam, st = np.nonzero(mask)
        # baselines read whole series of features; without them only the tracked rows are built
        grid = batch_features(counts, total, spec, rising_by_span=rising) if forecasters else None
        X = grid[fam, st] if grid is not None else batch_feature_rows(counts, total, spec, fam, st,
                                                                       rising_by_span=rising)
        level = X[:, level_col].astype(np.float64)
        cnt, thr, lab, ons = [], [], [], []
        for h, k in zip(horizons_s, ks):
            future = future_counts(counts, k)[fam, st]
            threshold = burst_threshold(level, h, spec.burst_ratio, spec.min_burst_count)
            full = np.zeros(counts.shape)
            full[fam, st] = threshold
            cnt.append(future)
            thr.append(threshold)
            lab.append(future > threshold)
            ons.append(onset_steps(counts, full, k)[fam, st])
        preds = {f.name: f.predict_block(counts, grid, ks)[fam, st].astype(np.float32) for f in forecasters}
        parts.append(Rows(X, np.stack(cnt, 1).astype(np.float32), np.stack(thr, 1).astype(np.float32),
                          np.stack(lab, 1), np.stack(ons, 1), (fam + begin).astype(np.int32), st.astype(np.int32),
                          preds))
    return _concat(parts, len(spec.names()), len(ks))


def _rising(data: FamilyCounts, spec: FeatureSpec, block: int) -> np.ndarray | None:
    """The families rising together at each step (trend.py), over every
    family of data: a block of families alone would undercount them."""
    if not spec.trend_spans:
        return None
    n = len(data.families)
    blocks = (data.dense(b, min(b + block, n)) for b in range(0, n, block))
    return rising_counts(blocks, spec.trend_spans, data.steps)


def concat_rows(parts: list[Rows]) -> Rows:
    """The rows of every part, in order (parts of the same features, horizons and baselines)."""
    if not parts:
        raise ValueError("concat_rows: no parts")
    return _concat(parts, parts[0].X.shape[1], parts[0].count.shape[1])


def _concat(parts: list[Rows], nf: int, nh: int) -> Rows:
    if not parts:
        z = np.zeros((0, nh))
        return Rows(np.zeros((0, nf), np.float32), z.astype(np.float32), z.astype(np.float32), z.astype(bool),
                    z.astype(np.int16), np.zeros(0, np.int32), np.zeros(0, np.int32))
    names = parts[0].baselines.keys()
    return Rows(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Rows) if f.name != "baselines"),
                baselines={n: np.concatenate([p.baselines[n] for p in parts]) for n in names})
