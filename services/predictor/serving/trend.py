"""Trend features: how fast a family and the cluster are rising (issue 22, item 2).

A burst that ramps up over a few steps can be seen before its threshold is
crossed, and a cluster-wide surge (many families rising at once) can foretell
one family's burst. For each span w (steps) in `FeatureSpec.trend_spans`,
with S_j = arrivals in the j-th trailing block of w steps (S_1 = (s - w, s],
S_2 = (s - 2w, s - w], S_3 = (s - 3w, s - 2w]; history before the origin
counts as zeros):

- rise_<w>: (S_1 - S_2) / w, the change of the mean count per step between
  the last two blocks (a slope, counts per step per w steps);
- accel_<w>: (S_1 - 2 S_2 + S_3) / w, the change of that slope (a second
  difference);
- cluster_rise_<w>, cluster_accel_<w>: the same for the cluster-wide total;
- rising_<w>: the number of families with S_1 > S_2 at step s (the families
  rising together), counted over every family the history holds.

Exactness: the inputs are trailing sums of integer counts, exact in float64
whichever way they are summed (cumulative differences in the batch form,
running sums in the incremental form), and `rise_accel` is the one place both
forms turn them into features, so the two forms agree bit for bit.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np


def trend_names(spans: Sequence[int]) -> list[str]:
    """The trend columns of FeatureSpec.names(), in order."""
    out: list[str] = []
    for w in spans:
        out += [f"rise_{w}", f"accel_{w}", f"cluster_rise_{w}", f"cluster_accel_{w}", f"rising_{w}"]
    return out


def sum_spans(spans: Sequence[int]) -> tuple[int, ...]:
    """The trailing sums the features read, per span: w, 2w, 3w steps each."""
    return tuple(m * w for w in spans for m in (1, 2, 3))


def rise_accel(s1: np.ndarray, s2: np.ndarray, s3: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(rise, accel) from trailing sums over w, 2w and 3w steps (float64,
    exact integers): the one formula both feature forms use."""
    now, prev, before = s1, s2 - s1, s3 - s2
    return (now - prev) / w, (now - 2.0 * prev + before) / w


def rising(s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """Per row, whether S_1 > S_2 (s1, s2: trailing sums over w and 2w steps)."""
    return s1 > s2 - s1


def trailing_sums(counts: np.ndarray, w: int) -> np.ndarray:
    """Sums over the trailing w steps (s - w, s] of each row of counts
    (rows, steps), zeros before the first step: float64 (rows, steps)."""
    counts = np.asarray(counts, dtype=np.float64)
    n, T = counts.shape
    cs = np.concatenate([np.zeros((n, 1)), np.cumsum(counts, axis=1)], axis=1)
    idx = np.arange(T)
    return cs[:, idx + 1] - cs[:, np.maximum(idx + 1 - w, 0)]


def rising_counts(blocks: Iterable[np.ndarray], spans: Sequence[int], steps: int) -> np.ndarray:
    """rising_<w> of every step: float64 (len(spans), steps), summed over
    dense blocks of families (each (rows, steps)); every family of the
    history must be in exactly one block."""
    out = np.zeros((len(spans), steps))
    for counts in blocks:
        for j, w in enumerate(spans):
            out[j] += np.count_nonzero(rising(trailing_sums(counts, w), trailing_sums(counts, 2 * w)), axis=0)
    return out


def batch_trend_columns(counts: np.ndarray, total: np.ndarray, rising_by_span: np.ndarray,
                        spans: Sequence[int]) -> list[np.ndarray]:
    """The trend columns in trend_names order, each (rows, steps) float64
    (or a broadcast view). rising_by_span: rising_counts over every family."""
    n, T = np.shape(counts)
    cluster = np.asarray(total, dtype=np.float64)[None, :]
    cols: list[np.ndarray] = []
    for j, w in enumerate(spans):
        own = [trailing_sums(counts, m * w) for m in (1, 2, 3)]
        whole = [trailing_sums(cluster, m * w)[0] for m in (1, 2, 3)]
        cols += list(rise_accel(*own, w))
        cols += [np.broadcast_to(c, (n, T)) for c in rise_accel(*whole, w)]
        cols.append(np.broadcast_to(np.asarray(rising_by_span[j], dtype=np.float64), (n, T)))
    return cols
