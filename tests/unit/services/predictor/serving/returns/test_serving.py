"""ReturnsCore, the served tracker: the same forecasts as a ReturnTracker fed
in time order, all-or-nothing turn-end batches, filters and order, arrivals
matched across the two reporting streams, and no model = FailedPrecondition."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.common.traces.records import TraceRequest
from speckv.services.predictor.serving.observations import Arrival
from speckv.services.predictor.serving.returns.serving import ReturnsCore, ReturnsSettings, TurnEndRecord
from speckv.services.predictor.serving.returns.store import PastTurn, SavedReturnModel
from speckv.services.predictor.serving.returns.tracker import ReturnTracker
from tests.support.returns_model import CONFIG, VERSION, synthetic_model
from tests.support.returns_conversations import conversations

NOW = 50_000.0


def saved() -> SavedReturnModel:
    return SavedReturnModel(synthetic_model(), CONFIG.features, VERSION, "", "test")


def core(clock: ManualClock | None = None, model: bool = True, **settings) -> ReturnsCore:
    return ReturnsCore(clock or ManualClock(NOW), ReturnsSettings(**settings), saved() if model else None)


def history(n: int = 40, seed: int = 3) -> list[TraceRequest]:
    """Requests of n conversations over the 600 s before NOW."""
    return [dataclasses.replace(r, arrival_s=r.arrival_s + NOW - 600.0) for r in conversations(n, 590.0, seed=seed)]


def feed_both(returns: ReturnsCore, clock: ManualClock, tracker: ReturnTracker, requests,
              service_s: float = 4.0) -> None:
    """The same arrivals and turn ends, in time order, to both, each when
    the clock reads its time; the clock ends at NOW."""
    events = sorted([(r.arrival_s, 0, r) for r in requests]
                    + [(r.arrival_s + service_s, 1, r) for r in requests if r.arrival_s + service_s < NOW],
                    key=lambda e: (e[0], e[1]))
    for t, kind, r in events:
        clock.set(max(t, clock.now()))
        if kind == 0:
            returns.observe([Arrival(t, r.family, prompt_tokens=r.prompt_tokens)])
            tracker.arrival(r.family, t, r.prompt_tokens)
        else:
            returns.report([TurnEndRecord(r.family, r.arrival_s, t, r.prompt_tokens, r.output_tokens)])
            tracker.turn_end(r.family, t, r.arrival_s, r.prompt_tokens, r.output_tokens)
    clock.set(NOW)


def test_forecasts_are_the_trackers_likeliest_first_and_honour_the_filters():
    clock = ManualClock(NOW - 600.0)
    returns, tracker = core(clock), ReturnTracker(synthetic_model(), CONFIG.features)
    feed_both(returns, clock, tracker, history())
    names, p = tracker.p_within(NOW, 120.0)
    assert len(names) >= 10
    answer = returns.forecast(120.0)
    expected = sorted(zip(names, p.tolist()), key=lambda row: -row[1])
    assert list(zip(answer.conversations, answer.probabilities.tolist())) == expected
    assert answer.model == VERSION and answer.now_s == NOW and answer.open_conversations == len(names)
    cut = float(np.median(p))
    above = returns.forecast(120.0, min_probability=cut)
    assert above.conversations == [n for n, q in expected if q >= cut] and len(above.conversations) < len(names)
    assert returns.forecast(120.0, max_conversations=3).conversations == [n for n, _ in expected[:3]]
    longer = returns.forecast(600.0, now_s=NOW + 10.0)
    assert longer.now_s == NOW + 10.0
    assert dict(zip(longer.conversations, longer.probabilities)) == pytest.approx(
        dict(zip(*tracker.p_within(NOW + 10.0, 600.0))))


def test_a_batch_with_one_bad_turn_end_is_refused_whole():
    returns = core()
    returns.observe([Arrival(NOW - 30.0, "a", prompt_tokens=900), Arrival(NOW - 20.0, "b", prompt_tokens=900)])
    good = TurnEndRecord("a", NOW - 30.0, NOW - 25.0, 900, 40)
    for bad, message in [
        (TurnEndRecord("", NOW - 20.0, NOW - 15.0, 900, 40), "conversation is empty"),
        (TurnEndRecord("b", NOW - 20.0, NOW - 21.0, 900, 40), "before arrival_s"),
        (TurnEndRecord("b", math.nan, NOW - 15.0, 900, 40), "arrival_s"),
        (TurnEndRecord("b", NOW - 20.0, math.inf, 900, 40), "end_s"),
        (TurnEndRecord("b", NOW - 20.0, NOW + 301.0, 900, 40), "max_clock_skew_s"),
        (TurnEndRecord("b", NOW - 900.0, NOW - 400.0, 900, 40), "max_clock_skew_s"),
        (TurnEndRecord("b", NOW - 20.0, NOW - 15.0, -1, 40), "token counts"),
        (TurnEndRecord("b" * 1025, NOW - 20.0, NOW - 15.0, 900, 40), "longer than"),
    ]:
        with pytest.raises(InvalidArgument, match=message.replace("[", r"\[")):
            returns.report([good, bad])
        assert returns.open_conversations == 0  # the good one was not applied either
    with pytest.raises(InvalidArgument, match="at most 2 per call"):
        core(max_turn_ends_per_call=2).report([good] * 3)
    assert returns.counters()["refused_batches"] == 8
    ack = returns.report([good])
    assert (ack.accepted, ack.opened, ack.open_conversations, ack.model) == (1, 1, 1, VERSION)


def test_forecast_arguments_are_checked_and_no_model_is_failed_precondition():
    returns = core()
    for kwargs in ({"within_s": 0.0}, {"within_s": math.nan}, {"within_s": 3601.0},
                   {"within_s": 10.0, "min_probability": 1.5}, {"within_s": 10.0, "max_conversations": -1},
                   {"within_s": 10.0, "now_s": NOW + 301.0}, {"within_s": 10.0, "now_s": -1.0}):
        with pytest.raises(InvalidArgument):
            returns.forecast(**kwargs)
    empty = core(model=False)
    with pytest.raises(FailedPrecondition, match="--returns-model"):
        empty.forecast(30.0)
    ack = empty.report([TurnEndRecord("a", NOW - 10.0, NOW, 10, 10)])  # validated, then dropped
    assert (ack.accepted, ack.model) == (0, "")
    with pytest.raises(InvalidArgument):
        empty.report([TurnEndRecord("a", NOW, NOW - 10.0, 10, 10)])
    assert empty.observe([Arrival(NOW, "a")]) == 0
    with pytest.raises(FailedPrecondition):
        empty.warm([PastTurn("a", 1.0, 2.0, 1, 1)])


def test_a_turn_end_is_matched_to_the_scheduler_reported_arrival():
    """The router's arrival time and the scheduler's stamp differ by the
    Route call: unmatched, the turn would count twice in the history and
    look returned (its own arrival after the one reported), never opening."""
    returns, tracker = core(), ReturnTracker(synthetic_model(), CONFIG.features)
    returns.observe([Arrival(NOW - 9.996, "c", prompt_tokens=3000)])
    tracker.arrival("c", NOW - 9.996, 3000)
    ack = returns.report([TurnEndRecord("c", NOW - 10.0, NOW - 2.0, 3000, 90)])
    assert ack.opened == 1 and returns.counters()["matched_arrivals"] == 1
    tracker.turn_end("c", NOW - 2.0, NOW - 9.996, 3000, 90)
    assert returns.forecast(60.0).probabilities.tolist() == tracker.p_within(NOW, 60.0)[1].tolist()
    unmatched = core(arrival_match_s=0.0)
    unmatched.observe([Arrival(NOW - 9.996, "c", prompt_tokens=3000)])
    assert unmatched.report([TurnEndRecord("c", NOW - 10.0, NOW - 2.0, 3000, 90)]).opened == 0


def test_an_arrival_reported_again_or_after_its_turn_end_does_not_close_the_conversation():
    returns = core()
    returns.report([TurnEndRecord("c", NOW - 10.0, NOW - 2.0, 3000, 90)])  # overtook its arrival's report
    assert returns.open_conversations == 1
    assert returns.observe([Arrival(NOW - 10.01, "c", prompt_tokens=3000)]) == 0  # that late report
    assert returns.open_conversations == 1 and returns.counters()["repeated_arrivals"] == 1
    assert returns.observe([Arrival(NOW - 1.0, "c", prompt_tokens=3500)]) == 1  # the next turn: it returned
    assert returns.open_conversations == 0


def test_warming_feeds_history_in_time_order_and_the_replayed_arrivals_are_recognised():
    requests = history()
    turns = [PastTurn(r.family, r.arrival_s, r.arrival_s + 4.0 if r.arrival_s + 4.0 < NOW else None,
                      r.prompt_tokens, r.output_tokens) for r in requests]
    clock = ManualClock(NOW - 600.0)
    warmed, fed = core(), core(clock)
    tracker = ReturnTracker(synthetic_model(), CONFIG.features)
    feed_both(fed, clock, tracker, requests)
    assert warmed.warm(list(reversed(turns))) == sum(t.end_s is not None for t in turns)
    assert answers(warmed) == answers(fed) and len(answers(fed)) >= 10
    # the warm start routes the newest history again: the same arrivals, reported by the scheduler
    assert warmed.observe([Arrival(r.arrival_s, r.family, prompt_tokens=r.prompt_tokens) for r in requests]) == 0
    assert answers(warmed) == answers(fed)


def answers(returns: ReturnsCore) -> dict[str, float]:
    answer = returns.forecast(300.0)
    return dict(zip(answer.conversations, answer.probabilities.tolist()))


def test_arrivals_the_count_core_rejects_are_not_tracked():
    returns = core()
    assert returns.observe([Arrival(NOW, ""), Arrival(math.nan, "a"), Arrival(NOW + 61.0, "a"),
                            Arrival(-1.0, "a"), Arrival(NOW, "a" * 1025)]) == 0
    assert returns.counters()["arrivals"] == 0


def test_settings_are_checked():
    for bad in ({"max_open_conversations": 0}, {"max_idle_s": 0.0}, {"arrival_match_s": -1.0},
                {"max_within_s": math.inf}):
        with pytest.raises(InvalidArgument):
            ReturnsSettings(**bad).validate()
