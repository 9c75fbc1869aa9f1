"""Censored training, monotone outputs, baselines and the online tracker."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from speckv.services.predictor.fitting.returns.baselines import BucketRate, fit_baselines
from speckv.services.predictor.fitting.returns.config import load_return_config
from speckv.services.predictor.fitting.returns.dataset import Split, build_rows
from speckv.services.predictor.fitting.returns.model_training import horizon_rows, train_return_model
from speckv.services.predictor.fitting.returns.turns import build_turns
from speckv.services.predictor.serving.returns import survival
from speckv.services.predictor.serving.returns.features import ReturnFeatureSpec
from speckv.services.predictor.serving.returns.tracker import ReturnTracker
from tests.support.returns_conversations import conversations

CONFIG = load_return_config(quick=True)
H = CONFIG.horizons_s
PARAMS = {**CONFIG.lightgbm, "num_boost_round": 20, "early_stopping_rounds": 5}


@pytest.fixture(scope="module")
def rows():
    return build_rows(build_turns(conversations(400, 3600.0, seed=2)), CONFIG.features)


def test_config_section_loads_with_the_documented_fields():
    assert H == (30.0, 60.0, 120.0, 300.0, 600.0)
    assert CONFIG.eval_fraction == 0.3 and CONFIG.validation_fraction == 0.2
    assert CONFIG.lightgbm["num_threads"] == 1 and CONFIG.tracker.max_open_conversations >= 1


def test_censoring_keeps_exactly_the_rows_whose_window_closed(rows):
    until = 2000.0
    parts = horizon_rows(rows, H, until, 0.2)
    for (fit, valid), h in zip(parts, H):
        used = np.sort(np.r_[fit, valid])
        assert used.tolist() == np.flatnonzero(rows.end_s + h <= until).tolist()
        assert len(valid) and rows.end_s[valid].min() > rows.end_s[fit].max()  # validation is the newest
    model = train_return_model(rows, H, until, PARAMS, 0.2)
    assert [f.train_rows + f.validation_rows for f in model.fits] == [int((rows.end_s + h <= until).sum()) for h in H]


def test_nothing_after_the_cut_decides_a_training_label(rows):
    until = 2000.0
    model = train_return_model(rows, H, until, PARAMS, 0.2)
    rng = np.random.default_rng(0)
    late = rows.end_s + rows.delay_s > until  # next arrival after the cut, or none
    delay = rows.delay_s.copy()
    delay[late] = until - rows.end_s[late] + rng.uniform(1e-3, 1e4, late.sum())  # another future after the cut
    other = train_return_model(dataclasses.replace(rows, delay_s=delay), H, until, PARAMS, 0.2)
    for a, b in zip(model.boosters, other.boosters):
        assert a.model_to_string() == b.model_to_string()
    assert model.tail == other.tail and model.tail.offsets_s  # the Kaplan-Meier tail is censored the same way


def test_probabilities_are_monotone_across_horizons_and_expected_time_in_range(rows):
    model = train_return_model(rows, H, 2500.0, PARAMS, 0.2)
    cdf = model.predict_cdf(rows.X)
    assert (np.diff(cdf, axis=1) >= 0).all() and (cdf >= 0).all() and (cdf <= 1).all()
    assert cdf.tolist() == survival.monotone(model.predict_raw(rows.X)).tolist()
    expected = model.expected_s(rows.X)
    assert ((expected >= 0) & (expected <= H[-1])).all()


def test_a_horizon_without_rows_predicts_a_constant(rows):
    model = train_return_model(rows, (30.0, 10_000.0), 3000.0, PARAMS, 0.2)
    assert model.boosters[1] is None and model.predict_raw(rows.X[:3])[:, 1].tolist() == [0.0, 0.0, 0.0]


def test_baselines_fit_on_censored_rows(rows):
    split = Split.of(0.0, 3600.0, 0.3)
    train = split.train(rows)
    constant, by_turn, by_gap = fit_baselines(train, H, split.eval_start_s, (1, 2), (60, 300), 0.0)
    known, labels = train.known(H, split.eval_start_s), train.labels(H)
    assert constant.rates == pytest.approx((labels & known).sum(0) / known.sum(0))
    first = train.turn_index == 0
    assert by_turn.predict(train.take(np.flatnonzero(first)))[0, 3] == pytest.approx(
        (labels[first, 3] & known[first, 3]).sum() / known[first, 3].sum())
    assert BucketRate.bucket(np.array([np.nan, 0.0, 60.0, 61.0, 500.0]), (60, 300)).tolist() == [0, 1, 2, 2, 3]
    assert by_gap.predict(train).shape == (len(train), len(H))


class _Fixed:
    """A stand-in model: every row gets the same horizon probabilities."""

    def __init__(self, spec: ReturnFeatureSpec, cdf):
        self.horizons_s = spec.horizons_s
        self.feature_names = spec.names()
        self.cdf = np.asarray(cdf, dtype=np.float64)
        self.tail = survival.Tail((10.0,), (0.5,))
        self.calls = 0

    def predict_cdf(self, X, num_threads=1):
        self.calls += 1
        return np.repeat(self.cdf[None, :], len(X), axis=0)


SPEC = ReturnFeatureSpec(horizons_s=(10.0, 20.0))


def test_tracker_forecast_is_conditional_on_no_return_yet():
    model = _Fixed(SPEC, [0.2, 0.5])
    tracker = ReturnTracker(model, SPEC)
    tracker.arrival("a", 0.0, 100)
    assert tracker.turn_end("a", 5.0, 0.0, 100, 10)
    (fc,) = tracker.forecast(20.0)
    assert fc.conversation == "a" and fc.end_s == 5.0 and fc.idle_s == 15.0
    cdf, tail = model.cdf[None], model.tail
    assert fc.p_within[10.0] == pytest.approx(survival.within(cdf, SPEC.horizons_s, 15.0, 10.0, tail)[0])
    assert fc.p_within[20.0] == pytest.approx(survival.within(cdf, SPEC.horizons_s, 15.0, 20.0, tail)[0])
    assert fc.expected_s == pytest.approx(survival.expected_remaining(cdf, SPEC.horizons_s, 15.0, tail=tail)[0])
    tracker.forecast(21.0)
    assert model.calls == 1  # a turn end is scored once


def test_tracker_forgets_a_conversation_when_its_next_turn_arrives():
    tracker = ReturnTracker(_Fixed(SPEC, [0.2, 0.5]), SPEC)
    tracker.arrival("a", 0.0)
    tracker.arrival("b", 0.0)
    assert tracker.turn_end("a", 1.0, 0.0, 10, 10) and tracker.turn_end("b", 1.0, 0.0, 10, 10)
    tracker.arrival("a", 30.0)
    assert "a" not in tracker and [f.conversation for f in tracker.forecast(31.0)] == ["b"]
    tracker.turn_end("a", 40.0, 30.0, 10, 10)
    assert [f.conversation for f in tracker.forecast(41.0)] == ["b", "a"]


def test_tracker_skips_a_turn_that_already_returned_and_caps_open_conversations():
    tracker = ReturnTracker(_Fixed(SPEC, [0.2, 0.5]), SPEC, max_open_conversations=2, max_idle_s=100.0)
    tracker.arrival("x", 0.0)
    tracker.arrival("x", 3.0)  # its next turn came before the first one's answer completed
    assert not tracker.turn_end("x", 5.0, 0.0, 10, 10) and "x" not in tracker
    for k, c in enumerate(("a", "b", "c")):
        tracker.arrival(c, 10.0 + k)
    for k, c in enumerate(("a", "b", "c")):
        assert tracker.turn_end(c, 20.0 + k, 10.0 + k, 10, 10)
    assert len(tracker) == 2 and "a" not in tracker  # least recently ended dropped
    assert [f.conversation for f in tracker.forecast(121.5)] == ["c"]  # b idle past max_idle_s
    with pytest.raises(ValueError):
        ReturnTracker(_Fixed(ReturnFeatureSpec(horizons_s=(5.0,), signal_name="other"), [0.1]), SPEC)


def test_tracker_batch_form_equals_the_objects():
    tracker = ReturnTracker(_Fixed(SPEC, [0.2, 0.5]), SPEC)
    assert tracker.forecast(0.0) == [] and tracker.forecast_batch(0.0).p_within.shape == (0, 2)
    for k, c in enumerate(("a", "b")):
        tracker.arrival(c, float(k))
    for k, c in enumerate(("a", "b")):
        tracker.turn_end(c, 5.0 + k, float(k), 10, 10)
    batch, objects = tracker.forecast_batch(30.0), tracker.forecast(30.0)
    assert batch.conversations == ("a", "b") and batch.idle_s.tolist() == [25.0, 24.0]
    assert [[f.p_within[h] for h in SPEC.horizons_s] for f in objects] == batch.p_within.tolist()
    assert [f.expected_s for f in objects] == batch.expected_s.tolist()


def test_tracker_grid_is_p_within_at_each_window():
    tracker = ReturnTracker(_Fixed(SPEC, [0.2, 0.5]), SPEC)
    assert tracker.p_within_grid(0.0, [10.0, 20.0])[1].shape == (0, 2)
    for k, c in enumerate(("a", "b")):
        tracker.arrival(c, float(k))
        tracker.turn_end(c, 5.0 + k, float(k), 10, 10)
    conversations, grid = tracker.p_within_grid(30.0, [7.0, 15.0, 40.0])
    assert conversations == ("a", "b")
    for j, window in enumerate((7.0, 15.0, 40.0)):
        assert grid[:, j].tolist() == pytest.approx(tracker.p_within(30.0, window)[1].tolist())
    assert (grid[:, 0] <= grid[:, 1]).all() and (grid[:, 1] <= grid[:, 2]).all()
