"""The count and burst models learned online in the simulator
(loadgen/sim/online_counts.py, `--predictor online`): the builtin EWMA until
a refit validates, then LightGBM trained on nothing but the arrivals the
core was fed, at the virtual time tick() is called; the same traffic gives
the same refits and forecasts (deterministic); the versions' directory goes
with close()."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from speckv.loadgen.sim.online_counts import SimCountRefits
from speckv.loadgen.sim.predictor import CoreForecasts, build_predictor
from speckv.services.common.clock import ManualClock
from speckv.services.predictor.fitting.retrain import RetrainOutcome
from speckv.services.predictor.serving.lgbm_served import LightGbmModel
from speckv.services.predictor.serving.observations import Arrival


def arrivals(until_s: float, seed: int = 4) -> list[Arrival]:
    """Twelve families at steady rates, two of them bursting every 60 s."""
    rng = np.random.default_rng(seed)
    out = []
    for family in range(12):
        rate = 0.05 + 0.05 * family
        t = float(rng.exponential(1 / rate))
        while t < until_s:
            out.append(Arrival(t, f"fam-{family}", "node-0", 1000, 0))
            t += float(rng.exponential(1 / rate))
    for family in (0, 1):
        for start in np.arange(30.0 + 7 * family, until_s, 60.0):
            out += [Arrival(float(start + 0.1 * i), f"fam-{family}", "node-0", 1000, 0) for i in range(8)]
    return sorted(out, key=lambda a: (a.time_s, a.family))


def play(until_s: float, interval_s: float = 300.0) -> tuple[SimCountRefits, CoreForecasts, ManualClock]:
    clock = ManualClock(0.0)
    core, _ = build_predictor("online", clock)
    refits = SimCountRefits.build(core, interval_s)
    next_refit = interval_s
    for arrival in arrivals(until_s):
        while next_refit <= arrival.time_s:
            clock.set(next_refit)
            refits.tick(next_refit)
            next_refit += interval_s
        clock.set(arrival.time_s)
        core.observe([arrival])
    clock.set(until_s)
    return refits, CoreForecasts(core), clock


@pytest.fixture(scope="module")
def played():
    """Two refits (300 and 600 s) on 650 s of traffic; closed after the module."""
    refits, forecasts, clock = play(650.0)
    yield refits, forecasts, clock
    refits.close()


def test_nothing_is_refitted_before_the_first_interval():
    refits, forecasts, _ = play(299.0)
    assert refits.results == [] and not isinstance(forecasts._core.serving_model, LightGbmModel)
    refits.close()


def test_lightgbm_serves_once_a_refit_validates(played):
    refits, forecasts, clock = played
    assert [at for at, _ in refits.results] == [300.0, 600.0]  # at the ticks' virtual times
    swaps = refits.swaps()
    assert swaps and isinstance(forecasts._core.serving_model, LightGbmModel)
    assert all(r.outcome in (RetrainOutcome.SWAPPED, RetrainOutcome.REJECTED) for _, r in refits.results)
    assert f"first served at {swaps[0]:.0f} s" in refits.note()
    assert forecasts.forecast(clock.now(), 10.0, 12)


def summary(refits, forecasts, clock):
    return ([(at, r.outcome, r.version, r.candidate_mae) for at, r in refits.results],
            [(f.family, f.expected_count, f.upper_quantile) for f in forecasts.forecast(clock.now(), 10.0, 12)])


def test_the_same_traffic_refits_and_forecasts_the_same(played):
    again = play(650.0)
    assert summary(*again) == summary(*played)
    again[0].close()


def test_close_removes_the_model_versions():
    refits = SimCountRefits.build(build_predictor("online", ManualClock(0.0))[0])
    directory = Path(refits.directory.name)
    assert directory.exists()
    refits.close()
    assert not directory.exists()
