"""Forecast scores: count errors, pinball loss, and burst alarms as events.

Rows are (family, step) sorted by family, then step. Count scores are per row.
Bursts are scored as events, because one burst is one thing to see coming:
- a burst episode is a maximal run of consecutive steps of one family whose
  label is true (the burst lands within the horizon of each of them);
- an alarm episode is a maximal run of consecutive steps with an alarm
  (probability >= the alarm threshold);
- recall = episodes with an alarm at some step of the episode / episodes;
- precision = alarm episodes that overlap a burst episode / alarm episodes;
- lead time of a detected episode = (t0 + onset(t0) - first alarm step in it)
  * step_s: seconds from the first alarm to the burst's first second (t0 is
  the episode's first step; negative when the alarm came after it landed).
  An alarm is raised at the end of its step, so a lead of one step means
  the alarm came at the instant the burst's first step began, before any of
  its arrivals; a lead of 0 means it came once that step was over;
- early = episodes whose first alarm has a lead > 0 (raised before the
  burst's first arrival could land) / episodes: the share of all bursts,
  missed ones included, alarmed before onset.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class BurstScore:
    precision: float
    recall: float
    f1: float
    lead_time_s: float  # median over detected episodes; NaN when none
    episodes: int
    alarms: int
    lead_mean_s: float = math.nan  # mean over detected episodes; NaN when none
    early: float = math.nan  # share of episodes alarmed with a lead > 0; NaN without episodes


def mae(pred: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - truth))) if len(truth) else math.nan


def rmse(pred: np.ndarray, truth: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred - truth) ** 2))) if len(truth) else math.nan


def pinball(upper: np.ndarray, truth: np.ndarray, q: float) -> float:
    diff = truth - upper
    return float(np.mean(np.maximum(q * diff, (q - 1.0) * diff))) if len(truth) else math.nan


def _runs(flag: np.ndarray, family: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (inclusive) row indices of maximal runs of flag over
    consecutive steps of one family."""
    if not len(flag):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    contiguous = np.zeros(len(flag), dtype=bool)
    contiguous[1:] = (family[1:] == family[:-1]) & (step[1:] == step[:-1] + 1)
    starts = np.flatnonzero(flag & ~(np.r_[False, flag[:-1]] & contiguous))
    nxt = np.r_[flag[1:] & contiguous[1:], False]
    ends = np.flatnonzero(flag & ~nxt)
    return starts, ends


def burst_score(label: np.ndarray, alarm: np.ndarray, onset: np.ndarray, family: np.ndarray, step: np.ndarray,
                step_s: float) -> BurstScore:
    label, alarm = label.astype(bool), alarm.astype(bool)
    e_start, e_end = _runs(label, family, step)
    a_start, a_end = _runs(alarm, family, step)
    alarm_rows = np.flatnonzero(alarm)
    first = np.searchsorted(alarm_rows, e_start)
    found = first < len(alarm_rows)
    detected = np.zeros(len(e_start), dtype=bool)
    detected[found] = alarm_rows[first[found]] <= e_end[found]
    leads = []
    for i in np.flatnonzero(detected):
        row = alarm_rows[first[i]]
        landing = step[e_start[i]] + onset[e_start[i]]
        leads.append((landing - step[row]) * step_s)
    cum = np.r_[0, np.cumsum(label)]
    true_alarms = int(np.count_nonzero(cum[a_end + 1] - cum[a_start] > 0))
    recall = float(detected.mean()) if len(e_start) else math.nan
    precision = true_alarms / len(a_start) if len(a_start) else math.nan
    f1 = (2 * precision * recall / (precision + recall)
          if precision + recall > 0 and not math.isnan(precision + recall) else math.nan)
    lead = float(np.median(leads)) if leads else math.nan
    early = sum(1 for v in leads if v > 0) / len(e_start) if len(e_start) else math.nan
    return BurstScore(precision, recall, f1, lead, len(e_start), len(a_start),
                      float(np.mean(leads)) if leads else math.nan, early)


def best_alarm_threshold(prob: np.ndarray, label: np.ndarray, onset: np.ndarray, family: np.ndarray,
                         step: np.ndarray, step_s: float, candidates: np.ndarray | None = None) -> float:
    """The alarm threshold with the best event F1 on these rows (ties: the
    lower one, which alarms earlier). Used on a validation slice only."""
    grid = candidates if candidates is not None else np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
                                                               0.6, 0.7, 0.8, 0.9])
    best, best_f1 = 0.5, -1.0
    for threshold in grid:
        score = burst_score(label, prob >= threshold, onset, family, step, step_s)
        f1 = 0.0 if math.isnan(score.f1) else score.f1
        if f1 > best_f1:
            best, best_f1 = float(threshold), f1
    return best
