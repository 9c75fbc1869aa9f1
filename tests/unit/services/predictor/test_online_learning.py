"""The live predictor's online learning (services/predictor/online_learning.py),
driven synchronously through step(): nothing before the thresholds, then a
served return model that ReturnsCore answers with, and served_models naming
both kinds with the right origin and window."""
from __future__ import annotations

import dataclasses

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import FailedPrecondition
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.fitting.returns.config import load_return_config
from speckv.services.predictor.fitting.returns.online import FitOutcome, OnlineReturnFitter
from speckv.services.predictor.online_learning import OnlineLearning, served_models
from speckv.services.predictor.server import build_core
from speckv.services.predictor.serving.observations import Arrival
from speckv.services.predictor.serving.returns.serving import ReturnsCore, ReturnsSettings, TurnEndRecord
from tests.support.returns_conversations import conversations

CONFIG = dataclasses.replace(load_return_config(quick=True), online=dataclasses.replace(
    load_return_config().online, min_turn_ends=200, min_history_s=300.0, refit_interval_s=200.0))


def build(clock: ManualClock) -> tuple[ReturnsCore, OnlineLearning]:
    fitter = OnlineReturnFitter(CONFIG, CONFIG.online, clock)
    returns = ReturnsCore(clock, ReturnsSettings(max_clock_skew_s=0.0, max_future_s=0.0), sink=fitter)
    return returns, OnlineLearning(fitter, returns, CONFIG.features, CONFIG.recalibration, check_s=1.0)


def play(returns: ReturnsCore, clock: ManualClock, until_s: float) -> None:
    events = []
    for r in conversations(n=900, duration_s=3600.0, seed=5):
        end = r.arrival_s + 25e-6 * r.prompt_tokens + 0.02 * r.output_tokens
        events += [(r.arrival_s, 0, r, end), (end, 1, r, end)]
    for t, kind, r, end in sorted(events, key=lambda e: (e[0], e[1], e[2].family)):
        if t >= until_s:
            break
        clock.set(max(clock.now(), t))
        if kind == 0:
            returns.observe([Arrival(time_s=t, family=r.family, prompt_tokens=r.prompt_tokens)])
        else:
            returns.report([TurnEndRecord(r.family, r.arrival_s, end, r.prompt_tokens, r.output_tokens)])


def test_step_serves_nothing_before_the_thresholds_then_a_validated_model():
    clock = ManualClock(0.0)
    returns, learning = build(clock)
    play(returns, clock, 200.0)
    assert learning.step() is None and returns.model_version == ""
    with pytest.raises(FailedPrecondition):
        returns.forecast(120.0)
    play(returns, clock, 1500.0)
    result = learning.step()
    assert result is not None and result.outcome is FitOutcome.SERVED
    assert returns.model_version == result.record.version == "online-1"
    answer = returns.forecast(120.0)
    assert answer.model == "online-1" and answer.open_conversations > 0  # the new tracker was warmed from the log
    assert learning.step() is None  # not due again before refit_interval_s


def test_served_models_name_each_kind_its_origin_and_window():
    clock = ManualClock(0.0)
    returns, learning = build(clock)
    core = build_core(PredictorConfig(), clock)
    assert [(m.kind, m.origin) for m in served_models(core, returns, learning, None)] == [("count", "builtin")]
    play(returns, clock, 1500.0)
    learning.step()
    count, ret = served_models(core, returns, learning, None)
    assert (count.kind, count.origin, count.online_learning) == ("count", "builtin", False)
    assert (ret.kind, ret.version, ret.online_learning) == ("return", "online-1", True)
    assert 0.0 <= ret.window_start_s < ret.window_end_s < ret.fitted_at_s == clock.now()
    assert ret.validation_metric.startswith("held-out Brier") and ret.validation_score <= ret.replaced_score
