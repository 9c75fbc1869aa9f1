"""The online level recalibration: the shift by hand, nothing after `now`
enters it, offline and live give the same shifts, and off is exactly the
model's own output."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.predictor.fitting.returns.config import ReturnConfig, load_return_config
from speckv.services.predictor.fitting.returns.dataset import build_rows
from speckv.services.predictor.fitting.returns.tuning import choose, validate_recalibration
from speckv.services.predictor.fitting.returns.turns import build_turns
from speckv.services.predictor.serving.returns.recalibration import (
    LevelRecalibrator,
    RecalibrationSpec,
    apply_shift,
    level_shift,
    recalibrate_rows,
)
from speckv.services.predictor.serving.returns.serving import ReturnsCore, ReturnsSettings
from speckv.services.predictor.serving.returns.store import load_return_model, save_return_model
from speckv.services.predictor.serving.returns.tracker import ReturnTracker
from tests.support.returns_model import CONFIG, synthetic_model
from tests.support.returns_conversations import conversations

H = CONFIG.horizons_s
ON = RecalibrationSpec(True, window_s=600.0, prior_rows=20.0, max_shift_logit=1.0)


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


@pytest.fixture(scope="module")
def turns():
    return build_turns(conversations(400, 3600.0, seed=11), CONFIG.service)


@pytest.fixture(scope="module")
def rows(turns):
    return build_rows(turns, CONFIG.features)


def test_the_shift_by_hand():
    # 100 resolved rows, 40 came back, the model had said 30 in all; 100 pseudo-rows at the model's mean:
    # r = (40 + 100 * 0.3) / 200 = 0.35, shift = logit(0.35) - logit(0.3)
    spec = RecalibrationSpec(True, 600.0, prior_rows=100.0, max_shift_logit=5.0)
    shift = level_shift(np.array([100.0, 0.0]), np.array([40.0, 0.0]), np.array([30.0, 0.0]), spec)
    assert shift[0] == pytest.approx(_logit(0.35) - _logit(0.3), rel=1e-9) and shift[1] == 0.0  # no rows: none
    # no shrinkage: logit(0.9) - logit(0.1) = 4.39 logit, inside a cap of 5, cut to a cap of 1
    free = level_shift(np.array([100.0]), np.array([90.0]), np.array([10.0]), dataclasses.replace(spec, prior_rows=0))
    assert free[0] == pytest.approx(_logit(0.9) - _logit(0.1), rel=1e-9)
    assert level_shift(np.array([100.0]), np.array([90.0]), np.array([10.0]),
                       RecalibrationSpec(True, 600.0, 0.0, 1.0))[0] == 1.0
    # shrinkage: 2 rows of 2 back against a mean of 0.3 with 198 pseudo-rows: r = (2 + 59.4) / 200 = 0.307
    few = level_shift(np.array([2.0]), np.array([2.0]), np.array([0.6]), dataclasses.replace(spec, prior_rows=198.0))
    assert few[0] == pytest.approx(_logit(0.307) - _logit(0.3), rel=1e-9) and few[0] < 0.04


def test_the_online_core_by_hand():
    # horizon 10 s, window 100 s, no shrinkage, cap 3 logit: four ends at 0..3 s predicted 0.2 each
    core = LevelRecalibrator(RecalibrationSpec(True, 100.0, 0.0, 3.0), (10.0,))
    for k in range(4):
        core.turn_end(f"c{k}", float(k), np.array([0.2]))
    core.arrival("c0", 5.0)  # back within 10 s
    assert core.shift(9.0)[0] == 0.0  # no window has closed yet: no evidence
    assert core.shift(10.0)[0] == 3.0  # one row, returned: logit(1 - 1e-6) - logit(0.2) = 15.2, capped
    core.arrival("c1", 11.0)  # 10 s after its end: its window [1, 11] includes it
    core.arrival("c2", 12.5)  # too late: its window closed at 12
    core.turn_end("c9", 15.0, np.array([0.2]))  # still open at 20 s: not counted
    shift = core.shift(20.0)[0]
    assert shift == pytest.approx(_logit(0.5) - _logit(0.2), rel=1e-12)  # 2 of 4 back, the model said 0.8 of 4
    assert apply_shift(np.array([[0.2]]), np.array([shift]))[0, 0] == pytest.approx(0.5, rel=1e-12)
    # at 111 s the windows that closed at 10 and 11 have left (closes in (11, 111]): c2, c3, c9, none back
    assert core.shift(111.0)[0] == -3.0


def test_nothing_after_now_enters_the_shift(rows):
    rng = np.random.default_rng(3)
    cdf = np.sort(rng.uniform(0.0, 0.6, (len(rows), len(H))), axis=1)
    out, shifts = recalibrate_rows(rows.end_s, rows.delay_s, cdf, H, ON)
    now = float(np.quantile(rows.end_s, 0.6))
    past = rows.end_s <= now
    # another future: rows after now get other ends, predictions and returns; past rows' returns after now move
    end, delay, other = rows.end_s.copy(), rows.delay_s.copy(), cdf.copy()
    future = ~past
    end[future] = now + np.sort(rng.uniform(0.0, 2000.0, future.sum()))
    other[future] = np.sort(rng.uniform(0.0, 1.0, (future.sum(), len(H))), axis=1)
    delay[future] = rng.exponential(200.0, future.sum())
    late = past & (rows.end_s + rows.delay_s > now)
    delay[late] = now - rows.end_s[late] + rng.uniform(1e-3, 1e4, late.sum())
    out2, shifts2 = recalibrate_rows(end, delay, other, H, ON)
    assert np.array_equal(shifts[past], shifts2[past]) and np.array_equal(out[past], out2[past])
    assert (shifts[past] != 0).any()  # the check is not vacuous


def test_the_tracker_shifts_exactly_as_the_offline_replay(turns, rows):
    model = synthetic_model()
    offline = recalibrate_rows(rows.end_s, rows.delay_s, model.predict_cdf(rows.X), H, ON)[1]
    tracker = ReturnTracker(model, CONFIG.features, recalibration=ON)
    events = sorted([(t.arrival_s, 0, t.conversation, t.turn_index, t) for t in turns]
                    + [(t.end_s, 1, t.conversation, t.turn_index, t) for t in turns], key=lambda e: e[:4])
    live = {}
    for k, (time_s, kind, conversation, _, turn) in enumerate(events):
        if kind == 0:
            tracker.arrival(conversation, time_s, turn.prompt_tokens)
        elif tracker.turn_end(conversation, time_s, turn.arrival_s, turn.prompt_tokens, turn.output_tokens) \
                and k % 7 == 0:  # asked now and then, as forecasts are
            live[(conversation, time_s)] = tracker.level_shift(time_s)
    index = {(c, e): i for i, (c, e) in enumerate(zip(rows.conversation.tolist(), rows.end_s.tolist()))}
    assert len(live) > 100
    got = np.array([live[key] for key in live])
    want = offline[[index[key] for key in live]]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)  # ties in end time may sum in another order
    assert (want != 0).any()


def _replay(tracker: ReturnTracker, turns, until_s: float) -> None:
    events = sorted([(t.arrival_s, 0, t) for t in turns] + [(t.end_s, 1, t) for t in turns],
                    key=lambda e: (e[0], e[1], e[2].conversation, e[2].turn_index))
    for time_s, kind, t in events:
        if time_s > until_s:
            break
        if kind == 0:
            tracker.arrival(t.conversation, time_s, t.prompt_tokens)
        else:
            tracker.turn_end(t.conversation, time_s, t.arrival_s, t.prompt_tokens, t.output_tokens)
        if int(time_s) % 97 == 0:
            tracker.forecast_batch(time_s)  # scoring at odd times must not change anything


def test_off_is_exactly_the_output_without_recalibration(turns):
    model = synthetic_model()
    trackers = [ReturnTracker(model, CONFIG.features),
                ReturnTracker(model, CONFIG.features, recalibration=dataclasses.replace(ON, enabled=False)),
                ReturnTracker(model, CONFIG.features, recalibration=None),
                ReturnTracker(model, CONFIG.features, recalibration=ON)]
    for tracker in trackers:
        _replay(tracker, turns, 3000.0)
    batches = [t.forecast_batch(3000.0) for t in trackers]
    for b in batches[1:3]:
        assert b.conversations == batches[0].conversations
        assert np.array_equal(b.p_within, batches[0].p_within) and np.array_equal(b.expected_s, batches[0].expected_s)
    assert trackers[0].level_shift(3000.0) is None and trackers[3].level_shift(3000.0) is not None
    assert not np.array_equal(batches[3].p_within, batches[0].p_within)  # on, it does move them
    assert np.array_equal(apply_shift(batches[0].p_within, np.zeros(len(H))), batches[0].p_within)


def test_the_served_tracker_recalibrates_as_the_manifest_says_and_format_1_is_served_without(tmp_path, turns):
    model = synthetic_model()
    on = save_return_model(tmp_path / "on", model, CONFIG.features, "v-on", "", ON)
    loaded = load_return_model(on)
    assert loaded.recalibration == ON
    old = save_return_model(tmp_path / "old", model, CONFIG.features, "v-old")
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["recalibration"]
    manifest["format"] = 1  # what was written before format 2
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert load_return_model(old).recalibration.enabled is False
    cores = {name: ReturnsCore(ManualClock(0.0), ReturnsSettings(max_clock_skew_s=0, max_future_s=0),
                               load_return_model(path)) for name, path in (("on", on), ("old", old))}
    plain = ReturnTracker(model, CONFIG.features)
    direct = ReturnTracker(model, CONFIG.features, recalibration=ON)
    for tracker in (plain, direct):
        _replay(tracker, turns, 3000.0)
    for core in cores.values():
        core.warm([_past(t) for t in turns if t.arrival_s <= 3000.0])
    for name, tracker in (("old", plain), ("on", direct)):
        conversations_, p = tracker.p_within(3000.0, 120.0)
        answer = cores[name].forecast(120.0, now_s=3000.0)
        got = dict(zip(answer.conversations, answer.probabilities.tolist()))
        assert got == pytest.approx(dict(zip(conversations_, p.tolist())), rel=1e-12)


def _past(t):
    from speckv.services.predictor.serving.returns.store import PastTurn
    return PastTurn(t.conversation, t.arrival_s, t.end_s if t.end_s <= 3000.0 else None, t.prompt_tokens,
                    t.output_tokens)


def test_the_config_section_reads_and_checks_it():
    config = load_return_config()
    assert isinstance(config.recalibration, RecalibrationSpec)
    raw = json.loads((__import__("speckv.services.predictor.fitting.returns.config", fromlist=["CONFIG_PATH"])
                      .CONFIG_PATH).read_text())["session_return"]
    assert ReturnConfig.from_dict({**raw, "recalibration": None}).recalibration.enabled is False
    with pytest.raises(ValueError, match="recalibration.window_s"):
        ReturnConfig.from_dict({**raw, "recalibration": {"enabled": True, "window_s": 0}})
    with pytest.raises(ValueError, match="recalibration.enabled"):
        ReturnConfig.from_dict({**raw, "recalibration": {"enabled": "yes"}})


def test_tuning_reads_nothing_from_the_evaluated_slice(rows):
    params = {**CONFIG.lightgbm, "num_boost_round": 10, "early_stopping_rounds": 3}
    until = 2500.0
    grid = [ON, dataclasses.replace(ON, window_s=300.0)]
    first = validate_recalibration(rows, H, until, (1800.0, 2100.0), params, 0.2, grid)
    rng = np.random.default_rng(5)
    after = rows.end_s + rows.delay_s > until  # returns after the cut and the rows of the slice
    delay = rows.delay_s.copy()
    delay[after] = until - rows.end_s[after] + rng.uniform(1e-3, 1e4, after.sum())
    X = rows.X.copy()
    X[rows.end_s >= until] = rng.normal(size=X[rows.end_s >= until].shape)
    second = validate_recalibration(dataclasses.replace(rows, delay_s=delay, X=X), H, until, (1800.0, 2100.0),
                                    params, 0.2, grid)
    for a, b in zip(first, second):
        assert a.scores == b.scores
    assert choose(first, 300.0) in first
    with pytest.raises(ValueError, match="before until_s"):
        validate_recalibration(rows, H, until, (until,), params, 0.2, grid)
