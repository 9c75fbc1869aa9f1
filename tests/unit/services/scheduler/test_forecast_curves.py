"""Forecast curves: P(within t) read as a step, and the oracle's curve from
the true next arrival."""
import pytest

from speckv.services.common.ids import Family
from speckv.services.common.traces.records import TraceRequest
from speckv.services.scheduler.forecasts import ForecastKind, FutureForecasts, TraceFutureArrivals, p_within

CURVE = ((30.0, 0.2), (60.0, 0.5), (300.0, 0.7))


@pytest.mark.parametrize("t, p", [(0.0, 0.0), (29.9, 0.0), (30.0, 0.2), (59.0, 0.2), (60.0, 0.5), (299.0, 0.5),
                                  (300.0, 0.7), (1e9, 0.7)])
def test_a_curve_reads_as_a_step(t, p):
    assert p_within(CURVE, t) == p
    assert p_within((), t) == 0.0


def test_the_oracle_s_retention_curve_steps_to_one_at_the_true_next_arrival():
    requests = [TraceRequest(t, 100, 10, (1,), 16, family) for t, family in
                [(5.0, "a"), (40.0, "b"), (70.0, "a"), (400.0, "c")]]
    source = FutureForecasts(TraceFutureArrivals(requests, time_offset_s=100.0), window_s=300.0,
                             kind=ForecastKind.RETENTION, curve=True)
    forecasts = {f.family: f for f in source.forecast(110.0, 2.0, 10)}  # scheduler 110 = trace 10
    assert set(forecasts) == {Family("a"), Family("b")}  # c comes after the window
    assert forecasts[Family("b")].curve == ((30.0, 1.0),)
    assert forecasts[Family("a")].curve == ((60.0, 1.0),)  # the first arrival after now, not the one before
    assert all(f.kind is ForecastKind.RETENTION and f.horizon_s == 300.0 for f in forecasts.values())


def test_without_curve_pricing_the_oracle_sends_no_curve():
    requests = [TraceRequest(5.0, 100, 10, (1,), 16, "a")]
    source = FutureForecasts(TraceFutureArrivals(requests), window_s=300.0, kind=ForecastKind.RETENTION)
    assert [f.curve for f in source.forecast(0.0, 2.0, 10)] == [()]
