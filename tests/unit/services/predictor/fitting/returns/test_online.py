"""OnlineReturnFitter (fitting/returns/online.py): a cold start serves
nothing, the first fit comes once the configured traffic has been seen, a
refit that validates worse on the held-out tail is not served, and every
served model says its version and training window."""
from __future__ import annotations

import dataclasses
import math

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.predictor.fitting.returns.config import OnlineSettings, load_return_config
from speckv.services.predictor.fitting.returns.dataset import build_rows
from speckv.services.predictor.fitting.returns.model_training import train_return_model
from speckv.services.predictor.fitting.returns.online import FitOutcome, OnlineReturnFitter, brier
from speckv.services.predictor.fitting.returns.turns import build_turns
from tests.support.returns_conversations import conversations

SETTINGS = OnlineSettings(min_turn_ends=200, min_history_s=300.0, window_s=3600.0, refit_interval_s=200.0,
                          holdout_fraction=0.25, min_holdout_rows=30)
CONFIG = load_return_config(quick=True)


def service_s(prompt: int, output: int) -> float:
    return 25e-6 * prompt + 0.02 * output


def traffic(until_s: float, n: int = 900, seed: int = 5):
    """(time, kind, request) events before until_s in time order: 0 arrival, 1 turn end."""
    events = []
    for r in conversations(n=n, duration_s=3600.0, seed=seed):
        if r.arrival_s < until_s:
            events.append((r.arrival_s, 0, r))
        end = r.arrival_s + service_s(r.prompt_tokens, r.output_tokens)
        if end < until_s:
            events.append((end, 1, r))
    events.sort(key=lambda e: (e[0], e[1], e[2].family))
    return events


def feed(fitter: OnlineReturnFitter, until_s: float, since_s: float = -math.inf) -> None:
    for t, kind, r in traffic(until_s):
        if t < since_s:
            continue
        if kind == 0:
            fitter.arrival(r.family, t, r.prompt_tokens)
        else:
            fitter.turn_end(r.family, t, r.arrival_s, r.prompt_tokens, r.output_tokens)


def test_a_cold_start_serves_nothing_until_enough_traffic():
    clock = ManualClock(0.0)
    fitter = OnlineReturnFitter(CONFIG, SETTINGS, clock)
    feed(fitter, 200.0)
    assert fitter.served is None and not fitter.due(200.0)
    result = fitter.fit_now(200.0)
    assert result.outcome is FitOutcome.WAITING and fitter.served is None


def test_the_first_fit_serves_a_model_with_its_version_and_training_window():
    clock = ManualClock(0.0)
    fitter = OnlineReturnFitter(CONFIG, SETTINGS, clock)
    feed(fitter, 1800.0)
    clock.set(1800.0)
    assert fitter.due()
    result = fitter.fit_now()
    assert result.outcome is FitOutcome.SERVED, result.reason
    model, record = fitter.served
    assert model is result.model and record.version == "online-1" and record.fitted_at_s == 1800.0
    first_end = min(t.end_s for t in fitter.replay()[0])
    assert record.window_start_s == pytest.approx(first_end)
    # the training window ends at the cut, a holdout_fraction of the window before now
    assert record.window_end_s == pytest.approx(1800.0 - 0.25 * (1800.0 - first_end))
    assert model.extra["until_s"] == record.window_end_s
    assert record.holdout_rows >= SETTINGS.min_holdout_rows
    assert record.holdout_score <= record.replaced_score  # the baseline it beat (or the baseline itself)
    assert not fitter.due(1800.0 + SETTINGS.refit_interval_s - 1) and fitter.due(1800.0 + SETTINGS.refit_interval_s)


def test_the_candidate_never_sees_a_label_decided_after_its_cut():
    """Training labels are censored at the cut: traffic changed after the cut
    trains the same boosters."""
    a, b = (OnlineReturnFitter(CONFIG, SETTINGS, ManualClock(0.0)) for _ in range(2))
    feed(a, 1800.0)
    feed(b, 1800.0)
    ra, rb = a.fit_now(1800.0), b.fit_now(1800.0)
    assert ra.record == rb.record  # deterministic: same traffic, same fit
    assert [f.trees for f in ra.model.fits] == [f.trees for f in rb.model.fits]


def test_a_refit_that_validates_worse_than_the_served_model_is_not_served():
    """The warm start here was trained on the whole window, the held-out tail
    included (it has seen the tail's labels), so a fair candidate cannot beat it there."""
    until = 1800.0
    turns = build_turns([e[2] for e in traffic(until) if e[1] == 0], service_s)
    turns = [dataclasses.replace(t, next_arrival_s=None) if t.next_arrival_s is not None and t.next_arrival_s > until
             else t for t in turns if t.end_s < until]
    rows = build_rows(turns, CONFIG.features)
    leaky = train_return_model(rows, CONFIG.horizons_s, until, CONFIG.lightgbm, CONFIG.validation_fraction)
    fitter = OnlineReturnFitter(CONFIG, SETTINGS, ManualClock(0.0), warm=leaky, warm_version="leaky")
    feed(fitter, until)
    result = fitter.fit_now(until)
    assert result.outcome is FitOutcome.KEPT, result.reason
    assert result.record.holdout_score > result.record.replaced_score
    model, record = fitter.served
    assert model is leaky and record.version == "leaky" and record.origin == "warm start"


def test_a_better_refit_replaces_the_served_model():
    fitter = OnlineReturnFitter(CONFIG, dataclasses.replace(SETTINGS, tolerance=1.0), ManualClock(0.0))
    feed(fitter, 1800.0)
    first = fitter.fit_now(1800.0)
    feed(fitter, 2400.0, since_s=1800.0)
    second = fitter.fit_now(2400.0)
    assert first.outcome is second.outcome is FitOutcome.SERVED
    assert fitter.served[1].version == "online-2" and fitter.served[1].window_end_s > first.record.window_end_s


def test_brier_scores_only_known_labels():
    fitter = OnlineReturnFitter(CONFIG, SETTINGS, ManualClock(0.0))
    feed(fitter, 1800.0)
    model = fitter.fit_now(1800.0).model
    rows = build_rows(fitter.replay()[0], CONFIG.features)
    nothing_known = rows.known(CONFIG.horizons_s, -1.0)
    assert math.isnan(brier(model, rows, nothing_known))
    assert 0.0 <= brier(model, rows, rows.known(CONFIG.horizons_s, 1800.0)) <= 1.0


@pytest.mark.parametrize("change", [{"holdout_fraction": 1.0}, {"min_turn_ends": 0}, {"window_s": 100.0},
                                    {"tolerance": -0.1}, {"refit_interval_s": math.inf}])
def test_bad_settings_are_refused(change):
    with pytest.raises(ValueError):
        OnlineReturnFitter(CONFIG, dataclasses.replace(SETTINGS, **change), ManualClock(0.0))


def test_the_committed_online_section_parses():
    assert load_return_config().online.validate() is None
    with pytest.raises(ValueError, match="unknown keys"):
        OnlineSettings.from_dict({"min_turns": 3})
