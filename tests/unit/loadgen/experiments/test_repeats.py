"""Between-runs intervals of repeated live runs: the Welch interval matches
its hand computation, too few runs give none, and the verdict reads the
interval's sign the right way for latency and for SLO attainment."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
from scipy.stats import t

from speckv.loadgen.experiments.metrics import RequestRecord, summarize
from speckv.loadgen.experiments.repeats import (
    RepeatDifference,
    differences,
    mean_difference,
    repeat_figures,
    repeats_table,
)
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger


def _summary(ttft_ms: float, repeats: dict[str, list[float]] | None = None):
    records = [RequestRecord(f"r{i}", 10.5, "f", 1000, 10, "node-0", ttft_ms=ttft_ms + i) for i in range(5)]
    return replace(summarize(records, frozenset({10}), 2000.0, ReplicaLedger().totals(), 64, {}), repeats=repeats)


def test_the_welch_interval_matches_its_hand_computation():
    a, b = [10.0, 12.0, 14.0], [20.0, 21.0, 22.0, 23.0]
    # means 12 and 21.5; variances 4 and 5/3; se^2 = 4/3 + 5/12 = 1.75
    se2 = 4.0 / 3 + (5.0 / 3) / 4
    dof = se2 ** 2 / ((4.0 / 3) ** 2 / 2 + ((5.0 / 3) / 4) ** 2 / 3)
    half = t.ppf(0.975, dof) * math.sqrt(se2)
    low, high = mean_difference(a, b)
    assert (low, high) == pytest.approx((-9.5 - half, -9.5 + half))


def test_too_few_runs_give_no_interval_and_runs_without_spread_give_the_difference():
    assert mean_difference([1.0], [1.0, 2.0]) is None
    assert mean_difference([1.0, 2.0], [3.0]) is None
    assert mean_difference([5.0, 5.0], [3.0, 3.0, 3.0]) == (2.0, 2.0)


@pytest.mark.parametrize("figure, low, high, verdict", [
    ("ttft_p99_ms", -50.0, -10.0, "better"),
    ("ttft_p99_ms", 10.0, 50.0, "worse"),
    ("ttft_p99_ms", -10.0, 10.0, "tie"),
    ("slo_attainment", 0.01, 0.05, "better"),
    ("slo_attainment", -0.05, -0.01, "worse"),
])
def test_the_verdict_reads_the_intervals_sign_for_the_figure(figure, low, high, verdict):
    assert RepeatDifference(figure, "predictive", 3, 0.0, 0.0, low, high).verdict == verdict


def test_repeat_figures_keep_each_runs_value_and_skip_figures_a_run_lacks():
    runs = [_summary(100.0), _summary(200.0)]
    figures = repeat_figures(runs)
    assert figures["ttft_p50_ms"] == [runs[0].ttft_p50_ms, runs[1].ttft_p50_ms]
    assert "returning_ttft_p99_ms" not in figures  # no token maps: the figure is None in both


def test_differences_compare_every_policy_with_the_baselines_runs_and_the_table_says_so():
    none = _summary(100.0, {"ttft_p99_ms": [100.0, 110.0, 105.0]})
    far = _summary(300.0, {"ttft_p99_ms": [300.0, 310.0, 305.0]})
    near = _summary(100.0, {"ttft_p99_ms": [95.0, 115.0, 104.0]})
    rows = {r.policy: r for r in differences({"none": none, "far": far, "near": near})}
    assert set(rows) == {"far", "near"}
    assert rows["far"].verdict == "worse" and rows["near"].verdict == "tie"
    assert rows["far"].mean - rows["far"].baseline_mean == pytest.approx(200.0)
    table = repeats_table({"none": none, "far": far})
    assert "| far | ttft_p99_ms | 3 | 105 | 305 | +200 |" in table and table.endswith("worse |")
    assert differences({"far": far}) == [] and repeats_table({"none": _summary(1.0), "far": far}) == ""
