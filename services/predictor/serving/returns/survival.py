"""From per-horizon return probabilities to a return-time distribution.

A model gives, for each row, F_i ~ P(T <= t_i) at horizons 0 < t_1 < ... < t_n
(T: seconds from the turn's end to the next turn's arrival; T = inf when the
conversation never returns). The shapes used here, with S = 1 - F:

- monotone(p): F = running maximum over horizons, clipped to [0, 1], so
  F_1 <= ... <= F_n (independent per-horizon classifiers need not be);
- between horizons S is linear through (0, 1), (t_1, S_1), ..., (t_n, S_n):
  a uniform return density inside each interval;
- past t_n the row has no information of its own, so S(x) = S_n R(x) with
  R a population tail (Tail: R(t_n) = 1, linear between its knots, flat
  after the last; model.fit_tail estimates it by Kaplan-Meier on the
  training rows). Without a tail R = 1: no return is predicted past t_n;
- within(F, a, t): P(T <= a + t | T > a) = (F(a + t) - F(a)) / (1 - F(a)),
  a = seconds since the end with no return yet; 1 when S(a) <= SURVIVAL_EPS
  (the model had it back by now: overdue);
- expected_remaining(F, a, cap): E[min(T - a, cap) | T > a] =
  integral_a^{a + cap} S(x) dx / S(a), exact for piecewise-linear S
  (trapezoids); 0 when S(a) <= SURVIVAL_EPS. expected_time(F) =
  expected_remaining(F, 0, t_n) = E[min(T, t_n)]: a conversation that never
  returns counts t_n. The tail does not enter it.
Every function is vectorised over rows: F (N, n), a (N,) or a scalar.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

SURVIVAL_EPS = 1e-12


@dataclass(frozen=True, slots=True)
class Tail:
    """R(t_n + offsets_s[k]) = ratio[k]: the share of conversations idle at
    the last horizon t_n still idle offsets_s[k] seconds later. Invariants:
    offsets strictly increasing and > 0; ratios non-increasing in [0, 1]."""

    offsets_s: tuple[float, ...] = ()
    ratio: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        off, r = np.asarray(self.offsets_s, dtype=np.float64), np.asarray(self.ratio, dtype=np.float64)
        if len(off) != len(r) or (len(off) and (off[0] <= 0 or np.any(np.diff(off) <= 0))):
            raise ValueError("Tail: offsets_s must be strictly increasing and > 0, one ratio each")
        if len(r) and (np.any(r < 0) or np.any(r > 1) or np.any(np.diff(r) > 0)
                       or not all(math.isfinite(x) for x in r)):
            raise ValueError("Tail: ratios must be non-increasing in [0, 1]")


def monotone(p: np.ndarray) -> np.ndarray:
    """Running maximum over horizons (last axis), clipped to [0, 1]."""
    return np.maximum.accumulate(np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0), axis=-1)


class SurvivalCurve:
    """The piecewise-linear survival of each row (module docstring), built
    once and read at many times: S at the knots and its running integral."""

    __slots__ = ("t", "S", "G", "cap_s")

    def __init__(self, F: np.ndarray, horizons_s: Sequence[float], tail: Tail | None = None) -> None:
        F = np.atleast_2d(np.asarray(F, dtype=np.float64))
        h = np.asarray(horizons_s, dtype=np.float64)
        if F.shape[1] != len(h) or not len(h) or h[0] <= 0 or np.any(np.diff(h) <= 0):
            raise ValueError("F needs one column per horizon and horizons must increase from > 0")
        S = np.concatenate([np.ones((len(F), 1)), 1.0 - F], axis=1)
        t = np.concatenate([[0.0], h])
        if tail is not None and tail.offsets_s:
            t = np.concatenate([t, h[-1] + np.asarray(tail.offsets_s)])
            S = np.concatenate([S, S[:, -1:] * np.asarray(tail.ratio)[None, :]], axis=1)
        self.t, self.S, self.cap_s = t, S, float(h[-1])
        self.G = np.concatenate([np.zeros((len(S), 1)), np.cumsum(np.diff(t) * (S[:, 1:] + S[:, :-1]) / 2.0, axis=1)],
                                axis=1)

    def at(self, x: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """S(x) and integral_0^x S, (N,) each (x < 0 reads as 0)."""
        t, S, G = self.t, self.S, self.G
        n, last = len(S), len(t) - 1
        x = np.maximum(np.broadcast_to(np.asarray(x, dtype=np.float64), (n,)), 0.0)
        rows = np.arange(n)
        j = np.minimum(np.searchsorted(t, x, side="right") - 1, last - 1)  # segment [t_j, t_j+1]
        inside = x < t[last]
        frac = np.clip((x - t[j]) / (t[j + 1] - t[j]), 0.0, 1.0)
        s_j = S[rows, j]
        s_in = s_j + frac * (S[rows, j + 1] - s_j)
        g_in = G[rows, j] + (x - t[j]) * (s_j + s_in) / 2.0
        s_out = S[:, last]
        g_out = G[:, last] + s_out * (x - t[last])
        return np.where(inside, s_in, s_out), np.where(inside, g_in, g_out)

    def cdf(self, x: np.ndarray | float) -> np.ndarray:
        return 1.0 - self.at(x)[0]

    def within(self, elapsed_s: np.ndarray | float, within_s: float,
               survival_at_elapsed: np.ndarray | None = None) -> np.ndarray:
        """P(T <= a + t | T > a), (N,); pass S(a) when already known."""
        s_a = self.at(elapsed_s)[0] if survival_at_elapsed is None else survival_at_elapsed
        s_b = self.at(np.asarray(elapsed_s, dtype=np.float64) + within_s)[0]
        alive = s_a > SURVIVAL_EPS
        return np.clip(np.where(alive, (s_a - s_b) / np.where(alive, s_a, 1.0), 1.0), 0.0, 1.0)

    def expected_remaining(self, elapsed_s: np.ndarray | float, cap_s: float | None = None) -> np.ndarray:
        """E[min(T - a, cap) | T > a] seconds, (N,); cap defaults to t_n."""
        cap = self.cap_s if cap_s is None else float(cap_s)
        s_a, g_a = self.at(elapsed_s)
        _, g_b = self.at(np.asarray(elapsed_s, dtype=np.float64) + cap)
        alive = s_a > SURVIVAL_EPS
        return np.where(alive, np.clip((g_b - g_a) / np.where(alive, s_a, 1.0), 0.0, cap), 0.0)


def cdf_at(F: np.ndarray, horizons_s: Sequence[float], x: np.ndarray | float, tail: Tail | None = None
           ) -> np.ndarray:
    """F(x) per row (N,), interpolated and extended as the module says."""
    return SurvivalCurve(F, horizons_s, tail).cdf(x)


def within(F: np.ndarray, horizons_s: Sequence[float], elapsed_s: np.ndarray | float, within_s: float,
           tail: Tail | None = None) -> np.ndarray:
    """P(return within within_s of now | none by elapsed_s after the end), (N,)."""
    return SurvivalCurve(F, horizons_s, tail).within(elapsed_s, within_s)


def expected_remaining(F: np.ndarray, horizons_s: Sequence[float], elapsed_s: np.ndarray | float,
                       cap_s: float | None = None, tail: Tail | None = None) -> np.ndarray:
    """E[min(T - a, cap) | T > a] in seconds, (N,); cap defaults to the last horizon."""
    return SurvivalCurve(F, horizons_s, tail).expected_remaining(elapsed_s, cap_s)


def expected_time(F: np.ndarray, horizons_s: Sequence[float]) -> np.ndarray:
    """E[min(T, t_n)] in seconds from the end, (N,)."""
    return expected_remaining(F, horizons_s, 0.0)


def kaplan_meier_tail(delay_s: np.ndarray, censor_s: np.ndarray, start_s: float, step_s: float,
                      min_at_risk: int) -> Tail:
    """Tail from right-censored delays: rows idle at start_s (delay > start_s,
    observed past it: censor > start_s) are at risk; a row's return is seen
    at delay_s when delay_s <= censor_s, else it is censored at censor_s.
    R is the Kaplan-Meier survival past start_s, read every step_s while at
    least min_at_risk rows are still at risk (flat after: no evidence)."""
    delay_s, censor_s = np.asarray(delay_s, dtype=np.float64), np.asarray(censor_s, dtype=np.float64)
    risk = (delay_s > start_s) & (censor_s > start_s)
    observed = np.minimum(delay_s[risk], censor_s[risk])
    event = delay_s[risk] <= censor_s[risk]
    if not len(observed):
        return Tail()
    order = np.argsort(observed, kind="stable")
    observed, event = observed[order], event[order]
    at_risk = len(observed) - np.arange(len(observed))  # rows with time >= this one's (ties: first of the run)
    times, first = np.unique(observed, return_index=True)
    deaths = np.add.reduceat(event.astype(np.int64), first)
    km = np.cumprod(1.0 - deaths / at_risk[first])
    offsets, ratios = [], []
    x = start_s + step_s
    while True:
        if int((observed >= x).sum()) < min_at_risk:
            break
        k = np.searchsorted(times, x, side="right") - 1
        offsets.append(x - start_s)
        ratios.append(float(km[k]) if k >= 0 else 1.0)
        x += step_s
    return Tail(tuple(offsets), tuple(ratios))
