"""Run-to-run spread: with `bench e2e --repeats N` each policy replays the
slice N times live, round-robin over the policies (so a slow minute of the
machine falls on all of them); with `simulate --seeds` each policy runs on
several realizations of a synthetic workload. Each request statistic
(bootstrap.INTERVAL_FIGURES) gets its value per run.

A policy's figure against the baseline's is then the difference of their
means with a 95 % Welch interval (scipy.stats.ttest_ind with unequal
variances: the runs of two policies need not spread alike). An interval
that holds 0 is a tie. Unlike the bootstrap over one run's requests, this
interval covers what a second run would do: live, the spread of the
machine, of warm-up and of the event ordering among the services; across
seeds, which realization of the workload was drawn. With 2-3 runs it is
wide (the t quantile at 2 degrees of freedom is 4.3): that is what a live
comparison on a shared machine can say, and the verdicts stay with the
simulator.

Pure: figures in, intervals out."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

from speckv.loadgen.experiments.bootstrap import INTERVAL_FIGURES
from speckv.loadgen.experiments.results import PolicySummary

CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class RepeatDifference:
    """mean(policy's runs) - mean(baseline's runs) of one figure, with its interval."""

    figure: str
    policy: str
    runs: int  # the policy's; the baseline's may differ
    baseline_mean: float
    mean: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """"tie" when the interval holds 0, else "better" or "worse" (lower
        TTFT, higher SLO attainment is better)."""
        if self.low <= 0.0 <= self.high:
            return "tie"
        higher = self.low > 0.0
        return "better" if higher == (self.figure == "slo_attainment") else "worse"


def repeat_figures(runs: Sequence[PolicySummary]) -> dict[str, list[float]]:
    """Per request statistic, its value in each run (runs without it left out)."""
    out: dict[str, list[float]] = {}
    for figure in INTERVAL_FIGURES:
        values = [getattr(s, figure) for s in runs]
        kept = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
        if kept:
            out[figure] = kept
    return out


def mean_difference(values: Sequence[float], baseline: Sequence[float],
                    confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The Welch interval of mean(values) - mean(baseline); None with fewer
    than two runs on either side. Both without spread: the difference itself."""
    if len(values) < 2 or len(baseline) < 2:
        return None
    a, b = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    if np.ptp(a) == 0.0 and np.ptp(b) == 0.0:
        d = float(a.mean() - b.mean())
        return d, d
    with warnings.catch_warnings():
        # Runs that nearly agree (an SLO attainment of 1.000 in all but one)
        # make scipy warn of lost precision in the variance; the interval is
        # then about as narrow as the runs' spread, which is what it says.
        warnings.filterwarnings("ignore", message="Precision loss occurred", category=RuntimeWarning)
        interval = stats.ttest_ind(a, b, equal_var=False).confidence_interval(confidence_level=confidence)
    return float(interval.low), float(interval.high)


def differences(policies: Mapping[str, PolicySummary], baseline: str = "none") -> list[RepeatDifference]:
    """Every policy's figures against the baseline's, for the figures both
    have two or more runs of; empty without the baseline or its repeats."""
    base = policies.get(baseline)
    if base is None or not base.repeats:
        return []
    out = []
    for name, summary in policies.items():
        if name == baseline or not summary.repeats:
            continue
        for figure in INTERVAL_FIGURES:
            mine, theirs = summary.repeats.get(figure, []), base.repeats.get(figure, [])
            interval = mean_difference(mine, theirs)
            if interval is None:
                continue
            out.append(RepeatDifference(figure, name, len(mine), float(np.mean(theirs)), float(np.mean(mine)),
                                        *interval))
    return out


def repeats_table(policies: Mapping[str, PolicySummary], baseline: str = "none") -> str:
    """Markdown: per policy and figure, the mean over runs, the difference
    from the baseline's mean with its interval, and the verdict."""
    rows = differences(policies, baseline)
    if not rows:
        return ""
    lines = [f"| policy | figure | runs | {baseline} mean | mean | difference | 95 % interval | verdict |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        digits = 3 if r.figure == "slo_attainment" else 0
        lines.append(f"| {r.policy} | {r.figure} | {r.runs} | {r.baseline_mean:.{digits}f} | {r.mean:.{digits}f} | "
                     f"{r.mean - r.baseline_mean:+.{digits}f} | [{r.low:+.{digits}f}, {r.high:+.{digits}f}] | "
                     f"{r.verdict} |")
    return "\n".join(lines)
