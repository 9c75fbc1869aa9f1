"""Online return learning in the simulator (loadgen/sim/online_returns.py):
no forecasts before the first fit, a fit at the virtual time tick() is
called, the tracker then warmed from what the fitter saw, and the same
traffic giving the same forecasts (deterministic)."""
from __future__ import annotations

import dataclasses

from speckv.loadgen.sim.online_returns import SimReturns
from speckv.loadgen.sim.returns import ReturnForecasts, train_returns
from speckv.services.common.clock import ManualClock
from speckv.services.predictor.fitting.returns.config import load_return_config
from speckv.services.predictor.fitting.returns.online import FitOutcome
from tests.support.returns_conversations import conversations

CONFIG = dataclasses.replace(load_return_config(quick=True), online=dataclasses.replace(
    load_return_config().online, min_turn_ends=200, min_history_s=300.0, refit_interval_s=200.0))


def play(returns: SimReturns, until_s: float, tick_every_s: float = 10.0) -> None:
    events = []
    for r in conversations(n=900, duration_s=3600.0, seed=5):
        end = r.arrival_s + 25e-6 * r.prompt_tokens + 0.02 * r.output_tokens
        events += [(r.arrival_s, 0, r), (end, 1, r)]
    events.sort(key=lambda e: (e[0], e[1], e[2].family))
    next_tick = tick_every_s
    for t, kind, r in events:
        if t >= until_s:
            break
        while next_tick <= t:
            returns.tick(next_tick)
            next_tick += tick_every_s
        if kind == 0:
            returns.arrival(r.family, t, r.prompt_tokens)
        else:
            returns.turn_end(r.family, t, r.arrival_s, r.prompt_tokens, r.output_tokens, 0.0)


def test_a_cold_start_forecasts_nothing_until_its_first_fit_then_forecasts_open_conversations():
    returns = SimReturns.build(CONFIG, ManualClock(0.0), None, online=True)
    source = ReturnForecasts(returns.slot, 120.0)
    play(returns, 250.0)
    assert returns.slot.tracker is None and source.forecast(250.0, 10.0, 50) == []
    returns = SimReturns.build(CONFIG, ManualClock(0.0), None, online=True)
    play(returns, 1500.0)
    served = [(at, r) for at, r in returns.fits if r.outcome is FitOutcome.SERVED]
    assert served and served[0][0] % 10.0 == 0.0  # fitted at a tick's virtual time
    assert returns.slot.tracker is not None and len(returns.slot.tracker) > 0  # warmed from the fitter's log
    forecasts = ReturnForecasts(returns.slot, 120.0).forecast(1500.0, 10.0, 50)
    assert forecasts and all(0.0 <= f.expected_count <= 1.0 for f in forecasts)
    assert "online return learning" in returns.note() and "served" in returns.note()


def test_the_same_traffic_fits_and_forecasts_the_same():
    runs = []
    for _ in range(2):
        returns = SimReturns.build(CONFIG, ManualClock(0.0), None, online=True)
        play(returns, 1500.0)
        runs.append(([(at, r.outcome, r.record) for at, r in returns.fits],
                     [(f.family, f.expected_count) for f in ReturnForecasts(returns.slot, 120.0).forecast(1500.0, 10.0, 50)]))
    assert runs[0] == runs[1]


def test_offline_alone_has_no_fitter_and_serves_its_model_from_the_start():
    trained = train_returns(conversations(n=600, duration_s=3600.0, seed=3), 2400.0)
    assert trained is not None
    returns = SimReturns.build(CONFIG, ManualClock(0.0), trained, online=False)
    assert returns.fitter is None and returns.slot.tracker is not None and returns.note() == ""
    warm = SimReturns.build(CONFIG, ManualClock(0.0), trained, online=True)
    assert warm.fitter is not None and warm.fitter.served[1].origin == "warm start"
