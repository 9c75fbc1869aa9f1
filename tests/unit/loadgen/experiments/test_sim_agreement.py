from __future__ import annotations

import pytest

from speckv.loadgen.experiments.metrics import RequestRecord
from speckv.loadgen.experiments.sim_agreement import agreement


def records(ttfts, failed=0):
    out = [RequestRecord(f"r{i}", float(i), "f", 64, 4, ttft_ms=t) for i, t in enumerate(ttfts)]
    out += [RequestRecord(f"x{i}", 0.0, "f", 64, 4, error="engine down") for i in range(failed)]
    return out


def test_ratios_are_simulated_over_live_per_percentile_of_served_requests():
    live = records([100.0] * 50 + [200.0] * 50, failed=3)  # failures count in neither
    sim = records([150.0] * 50 + [300.0] * 50)
    a = agreement("none", live, sim)
    assert a.live_ms[50] == pytest.approx(150.0) and a.sim_ms[50] == pytest.approx(225.0)
    assert a.ratios == pytest.approx({50: 1.5, 90: 1.5, 99: 1.5})
    assert a.to_json()["sim_over_live"] == {"p50": 1.5, "p90": 1.5, "p99": 1.5}
    assert "p50 225 simulated / 150 live ms = 1.50x" in a.line()


def test_a_run_that_served_nothing_has_no_ratio():
    a = agreement("none", records([], failed=2), records([10.0]))
    assert a.live_ms == {} and a.ratios == {}
    assert agreement("none", records([10.0]), records([])).ratios == {}
