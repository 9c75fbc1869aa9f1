"""Workloads at scale: a real trace replayed whole, merged with time-shifted
copies of itself for more nodes than it can load (synthetic.py generates
bursty workloads in addition to the real traces, never instead).

Scaling a trace to N nodes (`ScaledTrace`): the live configuration sizes
the trace for `base_nodes` nodes (services/config/e2e.json, 4 for the
Mooncake conversation trace), so N nodes get copies = ceil(N / base_nodes)
copies. Copy k (k = 0 is the trace itself) has every block hash offset by
k * (max hash + 1) and its family prefixed "c<k>:", so copies share no block
and no family; its arrival times are rotated by k * span / copies within the
trace's span [first, last arrival] (a time that passes the end wraps to the
start), so the merged trace covers the same hour at copies x the rate and
the copies' bursts do not line up.

Every simulated block hash also carries HASH_BASE = 2**62, so hashes sit
where real ones do: engines publish 64-bit digests (uint64 in the protos),
three in four of them at 2**62 or more, while the traces number their
blocks 0, 1, 2, ... Hashes are only ever compared for equality, so results
do not change (tests/unit/loadgen/workload/test_scaled.py runs a slice both
ways). It matters for speed: compiled code keeps an int below 2**62 unboxed
and makes a new Python int each time it passes one to a dict or set, which
the store and index paths do for every block of every prompt; a larger int
is passed by reference (docs/performance.md has the figures).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np

from speckv.services.common.ids import UINT64_MAX, Family
from speckv.services.common.traces import TraceRequest

HASH_BASE = 1 << 62  # added to every simulated block hash (module docstring)


def copy_family(copy: int, family: str) -> str:
    """Copy k's name for a family of the base trace (the trace's own for k = 0)."""
    return f"c{copy}:{family}" if copy else family


def hash_base(stride: int, copies: int) -> int:
    """What copy 0's hashes are offset by: HASH_BASE while every copy's
    hashes (below HASH_BASE + copies x stride) stay uint64, else 0 (a trace
    that already has 64-bit hashes). ValueError when even the copies overflow."""
    top = copies * stride - 1
    if top > UINT64_MAX:
        raise ValueError(f"{copies} copies of hashes up to {stride - 1} exceed uint64: "
                         "scale the trace to fewer nodes")
    return HASH_BASE if HASH_BASE + top <= UINT64_MAX else 0


def copies_for(nodes: int, base_nodes: int) -> int:
    return max(1, math.ceil(nodes / max(1, base_nodes)))


class ScaledTrace(Sequence[TraceRequest]):
    """The trace merged with copies - 1 disjoint, time-rotated copies (see
    the module docstring), in arrival order. Lazy: request i is built when
    read, so 256 copies of a 12k-request trace cost arrays, not 3 M records.
    Also a FutureArrivals (the oracle's truth) over the merged arrivals."""

    def __init__(self, trace: Sequence[TraceRequest], copies: int) -> None:
        base = sorted(trace, key=lambda r: r.arrival_s)
        self._base, self.copies = base, max(1, copies)
        times = np.array([r.arrival_s for r in base], dtype=np.float64)
        first = float(times.min()) if len(times) else 0.0
        span = (float(times.max()) - first + 1e-3) if len(times) else 1.0
        self._stride = max((h for r in base for h in r.block_hashes), default=0) + 1
        self._hash_base = hash_base(self._stride, self.copies)
        k = np.repeat(np.arange(self.copies), len(base))
        all_times = first + (np.tile(times - first, self.copies) + k * span / self.copies) % span
        order = np.argsort(all_times, kind="stable")
        self.times = all_times[order]
        self._copy = k[order].astype(np.int32)
        self._index = np.tile(np.arange(len(base)), self.copies)[order].astype(np.int32)

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        r, k = self._base[self._index[i]], int(self._copy[i])
        offset = self._hash_base + k * self._stride
        return TraceRequest(float(self.times[i]), r.prompt_tokens, r.output_tokens,
                            tuple([h + offset for h in r.block_hashes]), r.block_tokens, copy_family(k, r.family),
                            r.follow_ups)

    @property
    def base(self) -> list[TraceRequest]:
        """The trace itself, in arrival order (copy 0)."""
        return self._base

    def base_rows(self, lo: int, hi: int) -> np.ndarray:
        """For requests lo..hi-1, the row in `base` each is a copy of."""
        return self._index[lo:hi]

    def family_of(self, i: int) -> str:
        return copy_family(int(self._copy[i]), self._base[self._index[i]].family)

    def window(self, start_s: float, end_s: float) -> tuple[int, int]:
        """Index range of arrivals in [start_s, end_s)."""
        return (int(np.searchsorted(self.times, start_s, "left")), int(np.searchsorted(self.times, end_s, "left")))

    def counts(self, start: float, end: float) -> dict[Family, int]:
        """FutureArrivals: true arrivals per family in (start, end]. The
        oracle asks every tick for the next seconds, so each arrival is read
        several times: counted by (copy, base family) first, each family's
        name formatted once."""
        lo = int(np.searchsorted(self.times, start, "right"))
        hi = int(np.searchsorted(self.times, end, "right"))
        base = self._base
        by_copy = Counter(zip(self._copy[lo:hi].tolist(), [base[r].family for r in self._index[lo:hi].tolist()]))
        return {Family(copy_family(k, family)): n for (k, family), n in by_copy.items()}

    def first_arrivals(self, start: float, end: float) -> dict[Family, float]:
        """FutureArrivals: each family's first arrival in (start, end]."""
        lo = int(np.searchsorted(self.times, start, "right"))
        hi = int(np.searchsorted(self.times, end, "right"))
        base = self._base
        first: dict[tuple[int, str], float] = {}
        for t, k, r in zip(self.times[lo:hi].tolist(), self._copy[lo:hi].tolist(), self._index[lo:hi].tolist()):
            key = (k, base[r].family)
            if key not in first:
                first[key] = t
        return {Family(copy_family(k, family)): t for (k, family), t in first.items()}


class SliceView(Sequence[TraceRequest]):
    """Requests [lo, hi) of a sequence, without copying it."""

    def __init__(self, source: Sequence[TraceRequest], lo: int, hi: int) -> None:
        self._source, self._lo, self._hi = source, lo, max(lo, hi)

    def __len__(self) -> int:
        return self._hi - self._lo

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._source[self._lo + i]
