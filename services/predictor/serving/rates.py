"""Arrival-rate estimators over an ArrivalSeries, vectorised over families.

EWMA rate (exposure-weighted, continuous time). With decay weight
w(a) = 2 ** (-a / halflife_s) for an arrival a seconds before now:

    rate = sum_i w(now - t_i) / integral_{start}^{now} w(now - u) du

where start = max(oldest step in the window, oldest step ever observed). Each
arrival is weighted by the mean of w over its step (arrival times inside a step
are not kept). For a steady Poisson stream of rate r the numerator's
expectation is r times the denominator, so the estimate is unbiased at any
history length; the partly elapsed current step counts only for the part that
has elapsed. History shorter than one step counts as one step, so a first
arrival does not read as an infinite rate. Weight older than the window is
dropped (a fraction 2 ** (-window_s / halflife_s) of the total).

Last-step rate: arrivals in the newest complete step / step_s.

Unknown families (row -1) get the prior: the cluster-wide mean per-family rate,
i.e. the same estimator applied to the total series / families tracked.
All rates are arrivals per second.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from speckv.services.predictor.serving.arrival_ring import ArrivalSeries

LN2 = math.log(2.0)


@dataclass(slots=True)
class RateEstimate:
    rates: np.ndarray  # float64 per requested row, arrivals/s; the prior where the row is -1
    prior: float  # cluster-wide mean per-family rate, arrivals/s


def ewma_rates(series: ArrivalSeries, rows: np.ndarray, now_s: float, halflife_s: float) -> RateEstimate:
    """EWMA rate per row at now_s (clamped to the newest observation)."""
    if series.head_step is None:
        return RateEstimate(np.zeros(len(rows), dtype=np.float64), 0.0)
    weights, exposure = _step_weights(series, max(now_s, series.latest_time_s), halflife_s)
    prior = series.weighted_total(weights) / exposure / max(1, series.families_tracked)
    return _fill(series, rows, lambda known: series.weighted_sums(known, weights) / exposure, prior)


def last_step_rates(series: ArrivalSeries, rows: np.ndarray, now_s: float) -> RateEstimate:
    """Rate of the newest complete step before now_s (0 when none was observed)."""
    if series.head_step is None:
        return RateEstimate(np.zeros(len(rows), dtype=np.float64), 0.0)
    last_complete = series.step_of(max(now_s, series.latest_time_s)) - 1
    _, total = series.count_in_step(np.zeros(0, dtype=np.int64), last_complete)
    prior = total / series.step_s / max(1, series.families_tracked)

    def known_rates(known: np.ndarray) -> np.ndarray:
        counts, _ = series.count_in_step(known, last_complete)
        return counts / series.step_s

    return _fill(series, rows, known_rates, prior)


def _fill(series: ArrivalSeries, rows: np.ndarray, known_rates, prior: float) -> RateEstimate:
    if len(rows) and rows.min() >= 0:  # every row tracked (a ranking of all): no masks over 10k+ rows
        return RateEstimate(np.asarray(known_rates(rows), dtype=np.float64), prior)
    rates = np.full(len(rows), prior, dtype=np.float64)
    known = rows >= 0
    if known.any():
        rates[known] = known_rates(rows[known])
    return RateEstimate(rates, prior)


def _step_weights(series: ArrivalSeries, now_s: float, halflife_s: float) -> tuple[np.ndarray, float]:
    """Mean decay weight of each ring column over its step (0 for columns
    outside the history), and the decay-weighted exposure in seconds."""
    step, tau = series.step_s, halflife_s / LN2
    now_step = series.step_of(now_s)
    first = max(now_step - series.window_steps + 1, series.origin_step or 0)
    steps = series.column_steps()
    begin = steps * step
    end = np.minimum(begin + step, now_s)
    held = (steps >= first) & (steps <= now_step)
    # integral of exp(-(now - u) / tau) over [begin, end]
    mass = tau * (np.exp(-(now_s - end) / tau) - np.exp(-(now_s - begin) / tau))
    length = end - begin
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(length > 0, mass / length, 1.0)
    weights = np.where(held, mean, 0.0)
    history = max(now_s - first * step, step)
    exposure = tau * (1.0 - math.exp(-history / tau))
    return weights, exposure
