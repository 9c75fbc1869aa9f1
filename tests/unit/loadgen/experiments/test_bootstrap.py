"""Bootstrap intervals: the counted percentiles match NumPy's on the sample
a draw describes, chunked draws give valid and deterministic intervals,
every figure's interval holds the figure, and two runs of the same requests
are paired draw by draw whatever order their records come in."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import speckv.loadgen.experiments.bootstrap as bootstrap
from speckv.loadgen.experiments.bootstrap import (
    bootstrap_draws,
    bootstrap_intervals,
    counted_percentiles,
    draw_counts,
    paired_intervals,
    with_paired_intervals,
)
from speckv.loadgen.experiments.metrics import RequestRecord, summarize
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger


def _record(i, arrival, ttft, error=""):
    return RequestRecord(f"r{i}", arrival, "f", 1000, 10, "node-0", ttft_ms=ttft,
                         tpot_ms=10.0 if ttft is not None else None, e2e_ms=ttft, error=error)


def test_draw_counts_count_each_rows_draws_one_column_per_draw():
    draws = np.array([[0, 0, 2], [1, 2, 2]])
    counts = draw_counts(draws, 3)
    assert counts.shape == (3, 2)
    assert counts[:, 0].tolist() == [2, 0, 1]
    assert counts[:, 1].tolist() == [0, 1, 2]


@pytest.mark.parametrize("m", [0, 1, 2, 9, 10, 11])
def test_counted_percentiles_match_numpy_on_the_sample_each_column_describes(m):
    rng = np.random.default_rng(m)
    values = np.sort(rng.lognormal(5.0, 1.0, size=m))
    counts = rng.integers(0, 3, size=(m, 30)).astype(np.int32)
    if m:
        counts[:, 0] = 0  # a draw with no entry
    for q in (0.0, 50.0, 90.0, 99.0, 100.0):
        got = counted_percentiles(counts, values, q)
        for j in range(counts.shape[1]):
            sample = np.repeat(values, counts[:, j])
            if sample.size == 0:
                assert np.isnan(got[j])
            else:
                assert got[j] == pytest.approx(np.percentile(sample, q))


def test_chunked_draws_give_the_same_intervals_as_one_chunk_when_it_holds_them(monkeypatch):
    records = _spread(50)
    whole = bootstrap_intervals(records, frozenset({10}), 1000.0, resamples=200)
    monkeypatch.setattr(bootstrap, "DRAW_CHUNK_ELEMENTS", 200 * 50)
    assert bootstrap_intervals(records, frozenset({10}), 1000.0, resamples=200) == whole
    # Small chunks draw other samples: still deterministic, still about the figure.
    monkeypatch.setattr(bootstrap, "DRAW_CHUNK_ELEMENTS", 7 * 50)
    chunked = bootstrap_intervals(records, frozenset({10}), 1000.0, resamples=200)
    assert chunked == bootstrap_intervals(records, frozenset({10}), 1000.0, resamples=200)
    s = summarize(records, frozenset({10}), ttft_target_ms=1000.0, replicas=ReplicaLedger().totals(),
                  bytes_per_block=64, orders={})
    for key, (low, high) in chunked.items():
        assert low <= getattr(s, key) <= high, key


def _spread(n: int, burst_every: int = 4) -> list[RequestRecord]:
    # TTFTs 100..(100 + 10 (n - 1)) ms shuffled over arrival times; every
    # burst_every-th request arrives in burst second 10, the rest in 20-39.
    order = np.random.default_rng(5).permutation(n)
    return [_record(i, 10.5 if i % burst_every == 0 else 20.0 + (i % 20), 100.0 + 10.0 * float(order[i]))
            for i in range(n)]


def test_bootstrap_intervals_hold_their_figures_and_are_deterministic():
    records = _spread(200)
    s = summarize(records, frozenset({10}), ttft_target_ms=1000.0, replicas=ReplicaLedger().totals(),
                  bytes_per_block=64, orders={})
    intervals = bootstrap_intervals(records, frozenset({10}), 1000.0)
    assert set(intervals) == {"ttft_p50_ms", "ttft_p99_ms", "burst_ttft_p99_ms", "slo_attainment"}
    for key in ("ttft_p50_ms", "ttft_p99_ms", "burst_ttft_p99_ms", "slo_attainment"):
        low, high = intervals[key]
        assert low <= getattr(s, key) <= high, key
    # The median of 200 evenly spread TTFTs is known to within a few percent of the range, not exactly.
    low, high = intervals["ttft_p50_ms"]
    assert 0 < high - low < 0.3 * (2090.0 - 100.0)
    assert bootstrap_intervals(records, frozenset({10}), 1000.0) == intervals


def test_identical_requests_give_an_interval_of_no_width():
    records = [_record(i, 10.0 + i, 500.0) for i in range(50)]
    intervals = bootstrap_intervals(records, frozenset(), 1000.0)
    assert intervals["ttft_p99_ms"] == pytest.approx((500.0, 500.0))
    assert intervals["slo_attainment"] == pytest.approx((1.0, 1.0))
    assert "burst_ttft_p99_ms" not in intervals  # no burst request: no figure, no interval


def test_errors_are_misses_for_slo_and_absent_from_percentiles():
    records = [_record(i, 10.0 + i, 100.0) for i in range(30)] + [_record(30 + i, 50.0, None, error="x")
                                                                  for i in range(10)]
    intervals = bootstrap_intervals(records, frozenset(), 1000.0)
    assert intervals["ttft_p50_ms"] == pytest.approx((100.0, 100.0))
    low, high = intervals["slo_attainment"]
    assert low < 0.75 < high and high < 1.0


def test_returning_and_first_seen_intervals_need_both_token_maps():
    records = _spread(40)
    reusable = {r.request_id: (2000 if i % 2 else 500) for i, r in enumerate(records)}
    shared = {r.request_id: 500 for r in records}
    assert "returning_ttft_p99_ms" not in bootstrap_intervals(records, frozenset(), 1000.0, reusable)
    both = bootstrap_intervals(records, frozenset(), 1000.0, reusable, shared)
    assert {"returning_ttft_p99_ms", "first_seen_ttft_p99_ms"} <= set(both)
    returning = [r.ttft_ms for i, r in enumerate(records) if i % 2]
    assert both["returning_ttft_p99_ms"][1] <= max(returning)


def _shifted(records, delta_ms):
    return [dataclasses.replace(r, ttft_ms=r.ttft_ms + delta_ms, e2e_ms=r.ttft_ms + delta_ms) for r in records]


def test_a_constant_shift_has_a_paired_interval_of_exactly_that_shift_where_the_two_intervals_overlap():
    records = _spread(200)
    faster = _shifted(records, -30.0)
    bursts = frozenset({10})
    mine, base = bootstrap_intervals(faster, bursts, 1000.0), bootstrap_intervals(records, bursts, 1000.0)
    assert mine["ttft_p99_ms"][1] > base["ttft_p99_ms"][0]  # the two intervals overlap: a tie by overlap
    paired = paired_intervals(bootstrap_draws(faster, bursts, 1000.0), bootstrap_draws(records, bursts, 1000.0))
    for key in ("ttft_p50_ms", "ttft_p99_ms", "burst_ttft_p99_ms"):
        assert paired[key] == pytest.approx((-30.0, -30.0)), key
    assert paired["slo_attainment"][0] >= 0.0  # faster never loses a request within the target


def test_draws_do_not_depend_on_the_order_the_records_come_in():
    records = _spread(120)
    shuffled = [records[i] for i in np.random.default_rng(3).permutation(len(records))]
    a, b = bootstrap_draws(records, frozenset({10}), 1000.0), bootstrap_draws(shuffled, frozenset({10}), 1000.0)
    assert a.key == b.key
    for key, values in a.values.items():
        np.testing.assert_array_equal(values, b.values[key])


def test_runs_of_different_requests_are_never_paired():
    records = _spread(120)
    other = [dataclasses.replace(r, request_id=r.request_id + "x") for r in records]
    assert paired_intervals(bootstrap_draws(other, frozenset(), 1000.0),
                            bootstrap_draws(records, frozenset(), 1000.0)) == {}
    assert paired_intervals(bootstrap_draws(records[:-1], frozenset(), 1000.0),
                            bootstrap_draws(records, frozenset(), 1000.0)) == {}


def test_each_policy_but_the_baseline_gets_its_paired_intervals():
    records = _spread(100)
    runs = {"none": records, "predictive": _shifted(records, 5.0)}
    replicas = ReplicaLedger().totals()
    summaries = {name: summarize(rs, frozenset(), 1000.0, replicas, 64, {}) for name, rs in runs.items()}
    draws = {name: bootstrap_draws(rs, frozenset(), 1000.0) for name, rs in runs.items()}
    out = with_paired_intervals(summaries, draws)
    assert out["none"].ci95_vs_none is None
    assert out["predictive"].ci95_vs_none["ttft_p50_ms"] == pytest.approx((5.0, 5.0))
    assert out["predictive"].to_json()["ci95_vs_none"]["ttft_p50_ms"] == pytest.approx([5.0, 5.0])
    assert with_paired_intervals(summaries, {"predictive": draws["predictive"]}) == summaries  # no baseline


def test_a_paired_ratio_interval_is_exact_for_a_run_twice_as_slow_and_empty_for_other_requests():
    from speckv.loadgen.experiments.bootstrap import bootstrap_draws, paired_ratio_intervals
    from speckv.loadgen.experiments.metrics import RequestRecord

    def run(scale: float, ids: range) -> list[RequestRecord]:
        return [RequestRecord(f"r{i:03d}", 1.0 + i, "f", 1000, 10, "node-0", ttft_ms=scale * (50.0 + (i * 37) % 400))
                for i in ids]

    base = bootstrap_draws(run(1.0, range(200)), frozenset(), 2000.0, resamples=300)
    slow = bootstrap_draws(run(2.0, range(200)), frozenset(), 2000.0, resamples=300)
    ratios = paired_ratio_intervals(slow, base)
    low, high = ratios["ttft_p99_ms"]
    assert low == pytest.approx(2.0) and high == pytest.approx(2.0)  # same requests in every draw: no spread
    assert paired_ratio_intervals(bootstrap_draws(run(2.0, range(1, 201)), frozenset(), 2000.0, resamples=300),
                                  base) == {}


def test_reuse_recovered_gets_an_interval_holding_the_runs_share():
    from speckv.loadgen.experiments.bootstrap import bootstrap_draws, intervals_of
    from speckv.loadgen.experiments.metrics import RequestRecord, summarize
    from speckv.loadgen.experiments.replica_ledger import ReplicaLedger

    records = [RequestRecord(f"r{i:03d}", float(i), "f", 1000, 10, "node-0", ttft_ms=100.0 + i,
                             cached_tokens=(i % 5) * 100) for i in range(100)]
    reusable = {r.request_id: 600 for r in records}
    shared = {r.request_id: 100 for r in records}
    summary = summarize(records, frozenset(), 2000.0, ReplicaLedger().totals(), 64, {}, reusable, None, shared)
    low, high = intervals_of(bootstrap_draws(records, frozenset(), 2000.0, reusable, shared,
                                             resamples=500))["reuse_recovered_ratio"]
    assert low < summary.reuse_recovered_ratio < high
    assert 0.0 < low and high < 1.0
