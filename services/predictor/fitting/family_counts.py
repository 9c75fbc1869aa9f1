"""Arrivals of many families on one fixed time step, as one sparse array.

`FamilyCounts.counts` is a SciPy CSR matrix (families x steps): one array of
counts plus its boundaries (`indptr`: where each family's nonzero steps start
and end), not a dict of lists. Step k covers [start_s + k step_s,
start_s + (k + 1) step_s). Families are ordered by first arrival (ties:
name), so a chronological prefix of the rows is what a live predictor would
have seen first. Dense slices come out per block of families, so a trace with
thousands of families never needs a dense families x steps array at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import sparse


@dataclass(slots=True)
class FamilyCounts:
    families: list[str]
    counts: sparse.csr_matrix  # float64, (families, steps)
    step_s: float
    start_s: float  # start of step 0, seconds

    @property
    def steps(self) -> int:
        return self.counts.shape[1]

    def total(self) -> np.ndarray:
        """Cluster-wide arrivals per step, float64 (steps,)."""
        return np.asarray(self.counts.sum(axis=0), dtype=np.float64).ravel()

    def dense(self, begin: int, end: int) -> np.ndarray:
        """Rows [begin, end) as a dense float64 array (end - begin, steps)."""
        return self.counts[begin:end].toarray()

    def first_steps(self) -> np.ndarray:
        """Step of each family's first arrival (int64)."""
        c = self.counts
        return c.indices[c.indptr[:-1]].astype(np.int64)

    def last_steps(self) -> np.ndarray:
        """Step of each family's last arrival (int64); indices are sorted per row."""
        c = self.counts
        return c.indices[c.indptr[1:] - 1].astype(np.int64)


def aggregate(times_s: np.ndarray, families: Sequence[str], step_s: float, start_s: float = 0.0,
              end_s: float | None = None) -> FamilyCounts:
    """Counts arrival i (time times_s[i], family families[i]) in its step.
    Arrivals outside [start_s, end_s) are dropped. step_s > 0."""
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s={step_s}: must be finite and > 0")
    times = np.asarray(times_s, dtype=np.float64)
    names = np.asarray(families, dtype=object)
    if end_s is None:
        end_s = float(times.max()) + step_s if len(times) else start_s + step_s
    keep = (times >= start_s) & (times < end_s)
    times, names = times[keep], names[keep]
    steps = max(1, math.ceil((end_s - start_s) / step_s))
    cols = np.minimum(np.floor((times - start_s) / step_s).astype(np.int64), steps - 1)
    uniq, inverse = np.unique(names.astype(str), return_inverse=True)
    # order families by first arrival, then name
    first = np.full(len(uniq), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, inverse, cols)
    order = np.lexsort((np.arange(len(uniq)), first))
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    counts = sparse.csr_matrix((np.ones(len(cols)), (rank[inverse], cols)), shape=(len(uniq), steps))
    counts.sum_duplicates()
    counts.sort_indices()
    return FamilyCounts([str(uniq[i]) for i in order], counts, float(step_s), float(start_s))
