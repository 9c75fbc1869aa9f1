"""Percentile bootstrap intervals of a run's request statistics.

The figures of metrics.summarize that are statistics of the requests
(INTERVAL_FIGURES) get an interval: the records are drawn with replacement
BOOTSTRAP_RESAMPLES times, each figure is recomputed on every draw, and its
interval is the central CONFIDENCE share of those values. The share of
reusable tokens recovered (RATIO_FIGURES), a ratio of two sums over the
requests, gets one the same way: each draw's ratio of its own sums. Totals
of the run (bytes, orders, replicas) get none.

A draw is held as how many times it took each record (a row of counts), not
as the drawn sample itself: a percentile of the draw is then read off the
cumulative counts over the records sorted once by TTFT, in time linear in
the records per draw instead of a sort per draw. The draws are taken in
chunks of at most DRAW_CHUNK_ELEMENTS indices, so memory stays bounded for
slices of tens of thousands of requests (a simulated hour); a run whose
draws fit one chunk draws exactly what one call for all of them would.

Paired differences: the records are put in request-id order before drawing,
and the draws come from a fixed seed, so two runs of the same requests (two
policies on one slice) draw the same requests in every draw. The difference
of a figure between them (or their ratio: paired_ratio_intervals), draw by
draw, is then a paired bootstrap of that difference: it leaves out which requests the slice happened to hold, which
both runs share, and so is narrower than two overlapping intervals whenever
the same requests are slow under both (long prompts are, under any policy).
BootstrapDraws keeps each figure's value per draw (a few thousand floats)
and a key naming the request set, so runs of different requests are never
paired.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from speckv.loadgen.experiments.metrics import RequestRecord, is_returning, reuse_split
from speckv.loadgen.experiments.results import PolicySummary

# The figures of summarize that are statistics of the requests, and so get a
# bootstrap interval; the rest are totals of the run or ratios of totals.
INTERVAL_FIGURES = ("ttft_p50_ms", "ttft_p99_ms", "burst_ttft_p99_ms", "returning_ttft_p99_ms",
                    "first_seen_ttft_p99_ms", "slo_attainment")
# Ratios of two sums over the requests (a draw's figure is the ratio of its
# sums): with both token maps, the share of reusable tokens recovered.
# Beside INTERVAL_FIGURES, not among them: the live repeats read those alone.
RATIO_FIGURES = ("reuse_recovered_ratio",)
# Draws per interval: a percentile interval reads the tails of the draws, for
# which Efron and Tibshirani ("An Introduction to the Bootstrap", 1993) ask
# for at least 1,000; twice that keeps the 2.5 % point off a handful of draws.
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
# Record indices drawn per chunk (8 bytes each, and as many counts): 32 MiB.
DRAW_CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True, slots=True)
class BootstrapDraws:
    """Each figure's value in every draw (NaN where the draw held no sample
    of it), and a key naming the requests drawn from (their ids in order),
    the number of draws and the seed: draws with equal keys drew the same
    requests, draw by draw."""

    key: str
    values: dict[str, np.ndarray]


def bootstrap_intervals(records: Sequence[RequestRecord], bursts: frozenset[int], ttft_target_ms: float,
                        reusable_tokens: Mapping[str, int] | None = None,
                        shared_tokens: Mapping[str, int] | None = None,
                        resamples: int = BOOTSTRAP_RESAMPLES, confidence: float = CONFIDENCE,
                        seed: int = 0) -> dict[str, tuple[float, float]]:
    """The intervals of bootstrap_draws' figures (see there)."""
    return intervals_of(bootstrap_draws(records, bursts, ttft_target_ms, reusable_tokens, shared_tokens,
                                        resamples, seed), confidence)


def intervals_of(draws: BootstrapDraws, confidence: float = CONFIDENCE) -> dict[str, tuple[float, float]]:
    """Each figure's central `confidence` share of its draws; a figure no
    draw had a sample of gets none."""
    out: dict[str, tuple[float, float]] = {}
    for name, values in draws.values.items():
        interval = _central(values, confidence)
        if interval is not None:
            out[name] = interval
    return out


def paired_intervals(draws: BootstrapDraws, baseline: BootstrapDraws,
                     confidence: float = CONFIDENCE) -> dict[str, tuple[float, float]]:
    """Interval of each figure's difference, draws minus baseline, taken
    draw by draw over the same drawn requests (module docstring); draws in
    which either has no sample of the figure are left out. Empty when the
    two were not drawn from the same requests (their keys differ)."""
    return _paired(draws, baseline, np.subtract, confidence)


def paired_ratio_intervals(draws: BootstrapDraws, baseline: BootstrapDraws,
                           confidence: float = CONFIDENCE) -> dict[str, tuple[float, float]]:
    """As paired_intervals, of each figure's ratio, draws over baseline,
    draw by draw (a draw where the baseline's figure is 0 is left out): the
    interval of a verdict stated as a ratio, e.g. a returning p99 <= 0.7x
    another cluster's on the same requests."""
    return _paired(draws, baseline, _ratio_or_nan, confidence)


def _paired(draws: BootstrapDraws, baseline: BootstrapDraws, combine,
            confidence: float) -> dict[str, tuple[float, float]]:
    if draws.key != baseline.key:
        return {}
    combined = {name: combine(values, baseline.values[name]) for name, values in draws.values.items()
                if name in baseline.values}  # equal keys: as many draws each
    return intervals_of(BootstrapDraws(draws.key, combined), confidence)


def _ratio_or_nan(values: np.ndarray, base: np.ndarray) -> np.ndarray:
    out = np.full(values.shape, np.nan)
    np.divide(values, base, out=out, where=base != 0)
    return out


def with_paired_intervals(summaries: Mapping[str, PolicySummary], draws: Mapping[str, BootstrapDraws],
                          baseline: str = "none") -> dict[str, PolicySummary]:
    """The summaries, each policy but the baseline with its paired
    intervals against the baseline's (ci95_vs_none) where both have draws
    of the same requests; the rest as they were."""
    base = draws.get(baseline)
    out = dict(summaries)
    if base is None:
        return out
    for name, summary in summaries.items():
        mine = draws.get(name)
        if name != baseline and mine is not None:
            paired = paired_intervals(mine, base)
            if paired:
                out[name] = dataclasses.replace(summary, ci95_vs_none=paired)
    return out


def bootstrap_draws(records: Sequence[RequestRecord], bursts: frozenset[int], ttft_target_ms: float,
                    reusable_tokens: Mapping[str, int] | None = None,
                    shared_tokens: Mapping[str, int] | None = None,
                    resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> BootstrapDraws:
    """Draws of INTERVAL_FIGURES, each figure counted as summarize counts
    it (errors are misses for SLO attainment and left out of the
    percentiles). The returning and first-seen p99 need both token maps (as
    in summarize). A draw in which a figure has no sample (no burst request
    drawn) is left out of that figure's interval; a figure with no sample at
    all gets no interval.

    Deterministic: a fixed seed, so the same records always get the same
    intervals. What they cover is which requests the slice happened to hold;
    not the run-to-run spread of a live run, which is wider (queueing moves
    neighbouring requests' TTFTs together, and a busy machine moves them
    all). Nor can the interval of a tail percentile of few requests (the
    p99 of a hundred rests on the largest one or two) reach above the
    largest sample: it understates how much higher that figure could be. So
    a difference inside them is a tie, and one outside them is a hint, not
    proof."""
    records = sorted(records, key=lambda r: r.request_id)
    n = len(records)
    key = _request_set_key(records, resamples, seed)
    if n == 0:
        return BootstrapDraws(key, {})
    ttft = np.array([r.ttft_ms if r.served else np.nan for r in records], dtype=float)
    served = ~np.isnan(ttft)
    in_burst = np.array([math.floor(r.arrival_s) in bursts for r in records])
    groups = {"ttft_p50_ms": (50.0, served), "ttft_p99_ms": (99.0, served),
              "burst_ttft_p99_ms": (99.0, served & in_burst)}
    if reusable_tokens is not None and shared_tokens is not None:
        returning = np.array([is_returning(r.request_id, reusable_tokens, shared_tokens) for r in records])
        groups["returning_ttft_p99_ms"] = (99.0, served & returning)
        groups["first_seen_ttft_p99_ms"] = (99.0, served & ~returning)
    # Each group's records in TTFT order, so a draw's percentile is a rank in it.
    ranked = {name: _by_ttft(ttft, mask) for name, (_, mask) in groups.items()}
    within = (served & (np.nan_to_num(ttft, nan=math.inf) <= ttft_target_ms)).astype(float)
    shares = _recovered_shares(records, served, reusable_tokens, shared_tokens)
    per_draw: dict[str, list[np.ndarray]] = {name: [] for name in [*groups, "slo_attainment", *shares]}
    rng = np.random.default_rng(seed)
    for rows in _chunk_rows(resamples, n):
        counts = draw_counts(rng.integers(0, n, size=(rows, n)), n)
        for name, (q, _) in groups.items():
            order = ranked[name]
            per_draw[name].append(counted_percentiles(counts[order], ttft[order], q))
        per_draw["slo_attainment"].append(within @ counts / n)
        for name, (part, whole) in shares.items():
            per_draw[name].append(_ratio_or_nan(part @ counts, whole @ counts))
    return BootstrapDraws(key, {name: np.concatenate(values) for name, values in per_draw.items()})


def _recovered_shares(records: Sequence[RequestRecord], served: np.ndarray,
                      reusable_tokens: Mapping[str, int] | None,
                      shared_tokens: Mapping[str, int] | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """RATIO_FIGURES as (tokens recovered, reusable tokens beyond the shared
    prefix) per served request (metrics.reuse_split), so a draw's figure is
    the ratio of its two weighted sums, as summarize takes it over the run;
    none without both token maps."""
    if reusable_tokens is None or shared_tokens is None:
        return {}
    split = np.array([reuse_split(r, reusable_tokens, shared_tokens) for r in records], dtype=float).reshape(-1, 5)
    split[~served] = 0.0
    return {"reuse_recovered_ratio": (split[:, 1:].sum(axis=1), split[:, 0])}


def _request_set_key(records: Sequence[RequestRecord], resamples: int, seed: int) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for r in records:
        digest.update(r.request_id.encode())
        digest.update(b"\0")
    return f"{len(records)}:{resamples}:{seed}:{digest.hexdigest()}"


def draw_counts(draws: np.ndarray, n: int) -> np.ndarray:
    """How often each row of draws (indices into n records) drew each
    record, one column per draw: shape (n, rows), so that a group of records
    is a gather of whole rows and a running count runs down the columns."""
    rows = draws.shape[0]
    flat = (draws * rows + np.arange(rows, dtype=np.int64)[:, None]).ravel()
    return np.bincount(flat, minlength=n * rows).reshape(n, rows).astype(np.int32)


def counted_percentiles(counts: np.ndarray, sorted_values: np.ndarray, q: float) -> np.ndarray:
    """Per column of counts (how many times each of sorted_values,
    ascending, was drawn: one row per value), the q-th percentile of the
    sample it describes, interpolated linearly as np.percentile's default
    does; NaN for a column that drew none."""
    m, draws = counts.shape
    if m == 0:
        return np.full(draws, np.nan)
    cumulative = np.cumsum(counts, axis=0, dtype=np.int32)
    count = cumulative[-1].astype(np.int64)
    position = np.maximum(count - 1, 0) * (q / 100.0)
    low = np.floor(position).astype(np.int64)
    high = np.minimum(low + 1, np.maximum(count - 1, 0))
    below = sorted_values[_rank_index(cumulative, low)]
    above = sorted_values[_rank_index(cumulative, high)]
    result = below + (above - below) * (position - low)
    result[count == 0] = np.nan
    return result


def _rank_index(cumulative: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Per column, the index of the value at 0-based rank `rank` of its
    sample: the first position whose cumulative count exceeds the rank."""
    index = (cumulative <= rank[None, :]).sum(axis=0)
    return np.minimum(index, cumulative.shape[0] - 1)


def _by_ttft(ttft: np.ndarray, mask: np.ndarray) -> np.ndarray:
    chosen = np.flatnonzero(mask)
    return chosen[np.argsort(ttft[chosen], kind="stable")]


def _chunk_rows(resamples: int, n: int) -> list[int]:
    per_chunk = max(1, DRAW_CHUNK_ELEMENTS // n)
    return [min(per_chunk, resamples - start) for start in range(0, resamples, per_chunk)]


def _central(values: np.ndarray, confidence: float) -> tuple[float, float] | None:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None
    tail = (1.0 - confidence) / 2 * 100.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)
