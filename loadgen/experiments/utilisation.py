"""Cluster utilisation from per-node busy time, sampled every second: do
nodes swing between idle and overloaded?

From request records alone (live and simulated runs keep the same ones): a
request occupies its node from its submission (arrival plus its promotion or
pull, whichever landed last) to its last token; a node is *busy* while it
holds at least one request, and its busy fraction in second s is the share
of [s, s + 1) it is busy. A node is *overloaded* in second s when some
request on it has waited in its queue longer than the TTFT target at some
instant of that second (its queue interval runs from submission for
queue_ms; the part past the target is the overload).

- overload_idle_share: of the node-seconds the nodes were alive, the share
  spent idle (1 - busy fraction) while another alive node was overloaded in
  that second. 0 is a cluster that never idles beside a queue.
- busy_cv: the mean, over seconds in which any alive node was busy, of the
  coefficient of variation (population std / mean) of the alive nodes' busy
  fractions. 0 is perfectly even load.

A node's lifetime (it joined late, or died) bounds the seconds it counts in.
Pure: no clock, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from speckv.loadgen.experiments.metrics import RequestRecord


@dataclass(frozen=True, slots=True)
class Utilisation:
    overload_idle_share: float | None
    busy_cv: float | None
    seconds: int  # seconds measured (first arrival to last finish)
    node_seconds: float  # alive node-seconds in them

    def to_json(self) -> dict[str, object]:
        return {"overload_idle_share": self.overload_idle_share, "busy_cv": self.busy_cv, "seconds": self.seconds,
                "node_seconds": self.node_seconds}


def _merged(intervals: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted union of [a, b) intervals."""
    starts: list[float] = []
    ends: list[float] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)


def time_per_second(intervals: list[tuple[float, float]], first_s: int, seconds: int) -> np.ndarray:
    """Covered time of each second [first_s + k, first_s + k + 1), k < seconds,
    by the union of intervals (each value in [0, 1])."""
    a, b = _merged(intervals)
    edges = first_s + np.arange(seconds + 1, dtype=float)
    if a.size == 0:
        return np.zeros(seconds)
    lengths = np.concatenate([[0.0], np.cumsum(b - a)])
    done = np.searchsorted(b, edges, side="right")  # intervals ended by each edge
    covered = lengths[done]
    partial = np.minimum(done, a.size - 1)
    inside = (done < a.size) & (a[partial] < edges)
    covered = covered + np.where(inside, edges - a[partial], 0.0)
    return np.diff(covered)


def busy_series(records: Sequence[RequestRecord], nodes: Sequence[str], first_s: int,
                seconds: int) -> dict[str, list[float]]:
    """Each node's busy fraction per second over [first_s, first_s + seconds)."""
    spans: dict[str, list[tuple[float, float]]] = {n: [] for n in nodes}
    for r in records:
        if r.served and r.node_id in spans and r.e2e_ms is not None:
            spans[r.node_id].append((_submitted_s(r), r.arrival_s + r.e2e_ms / 1e3))
    return {n: [round(float(x), 3) for x in time_per_second(spans[n], first_s, seconds)] for n in nodes}


def _submitted_s(r: RequestRecord) -> float:
    return r.arrival_s + max(r.promote_ms, r.fetch_ms) / 1e3


def utilisation(records: Sequence[RequestRecord], ttft_target_ms: float, nodes: Sequence[str],
                lifetimes: Mapping[str, tuple[float, float]] | None = None) -> Utilisation:
    """The figures over the span of the served records; nodes: every node
    that existed (one that served nothing still idles); lifetimes: node ->
    (joined, left) trace seconds, default the whole span."""
    served = [r for r in records if r.served and r.node_id and r.e2e_ms is not None]
    if not served or not nodes:
        return Utilisation(None, None, 0, 0.0)
    first = math.floor(min(r.arrival_s for r in served))
    last = math.ceil(max(r.arrival_s + (r.e2e_ms or 0.0) / 1e3 for r in served))
    seconds = max(1, last - first)
    busy_spans: dict[str, list[tuple[float, float]]] = {n: [] for n in nodes}
    over_spans: dict[str, list[tuple[float, float]]] = {n: [] for n in nodes}
    for r in served:
        start = _submitted_s(r)
        busy_spans.setdefault(r.node_id, []).append((start, r.arrival_s + (r.e2e_ms or 0.0) / 1e3))
        if r.queue_ms > ttft_target_ms:
            over_spans.setdefault(r.node_id, []).append((start + ttft_target_ms / 1e3, start + r.queue_ms / 1e3))
    names = list(busy_spans)
    busy = np.stack([time_per_second(busy_spans[n], first, seconds) for n in names], axis=1)
    over = np.stack([time_per_second(over_spans[n], first, seconds) > 0 for n in names], axis=1)
    alive = np.stack([time_per_second([_clamped((lifetimes or {}).get(n), first, first + seconds)], first, seconds)
                      for n in names], axis=1)
    busy = np.minimum(busy, alive)
    over &= alive > 0
    others_over = (over.sum(axis=1, keepdims=True) - over) > 0
    idle = np.clip(np.round(alive - busy, 9), 0.0, None)  # sums of cumulative sums leave ~1e-16 of false idleness
    node_seconds = float(alive.sum())
    share = float((idle * others_over).sum() / node_seconds) if node_seconds else None
    return Utilisation(share, _busy_cv(busy, alive > 0), seconds, node_seconds)


def _clamped(life: tuple[float, float] | None, lo: float, hi: float) -> tuple[float, float]:
    return (lo, hi) if life is None else (max(life[0], lo), min(life[1], hi))


def _busy_cv(busy: np.ndarray, alive: np.ndarray) -> float | None:
    cvs = []
    for row, mask in zip(busy, alive):
        values = row[mask]
        if values.size and values.mean() > 0:
            cvs.append(float(values.std() / values.mean()))
    return float(np.mean(cvs)) if cvs else None
