"""Session-return foresight in the simulator (loadgen/sim/returns.py): what
it trains on, and the forecasts it hands the planner."""
from __future__ import annotations

import pytest

from speckv.loadgen.sim.returns import MIN_TRAINING_TURNS, ReturnForecasts, train_returns, warm
from speckv.services.scheduler.forecasts import ForecastKind
from tests.support.returns_conversations import conversations

UNTIL_S = 2400.0


@pytest.fixture(scope="module")
def trained():
    requests = conversations(n=600, duration_s=3600.0, seed=3)
    model = train_returns(requests, UNTIL_S, "synthetic conversations")
    assert model is not None
    return model, requests


def test_it_trains_only_on_turns_before_the_slice(trained):
    model, requests = trained
    assert model.model.extra["until_s"] == UNTIL_S
    assert "before 2400 s" in model.description
    # The same history with every later request changed trains the same model.
    later_changed = [r for r in requests if r.arrival_s < UNTIL_S] + [
        r.__class__(r.arrival_s, r.prompt_tokens * 3, 1, r.block_hashes, r.block_tokens, r.family)
        for r in requests if r.arrival_s >= UNTIL_S]
    again = train_returns(later_changed, UNTIL_S)
    assert again is not None and again.model.fits == model.model.fits


def test_too_little_history_trains_nothing():
    few = conversations(n=40, duration_s=3600.0, seed=1)
    assert len(few) < MIN_TRAINING_TURNS and train_returns(few, 3600.0) is None


def test_the_planner_gets_each_open_conversations_chance_to_return_within_the_window(trained):
    model, requests = trained
    tracker = model.tracker()
    warm(tracker, requests, UNTIL_S, model.config)
    source = ReturnForecasts(tracker, window_s=15.0, refresh_s=1.0)
    forecasts = source.forecast(UNTIL_S, 2.0, 50)
    assert 0 < len(forecasts) <= 50
    assert all(f.kind is ForecastKind.RETURN and f.horizon_s == 15.0 for f in forecasts)
    assert all(0.0 <= f.expected_count <= 1.0 and f.upper_quantile == f.expected_count for f in forecasts)
    counts = [f.expected_count for f in forecasts]
    assert counts == sorted(counts, reverse=True)  # the likeliest first
    assert source.forecast(UNTIL_S + 0.5, 2.0, 50) is forecasts  # not refreshed within refresh_s
    first = forecasts[0].family
    tracker.arrival(first, UNTIL_S + 1.0)  # it came back: no longer pending
    assert first not in {f.family for f in source.forecast(UNTIL_S + 1.0, 2.0, 50)}
