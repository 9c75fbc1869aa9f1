"""`speckv simulate --predictor lightgbm`: a short real simulation on the
Mooncake conversation trace whose predictor is LightGBM trained, in the
simulator, on the trace before the slice only."""
from __future__ import annotations

import dataclasses
import math
import re

import pytest

from speckv.loadgen.e2e_config import load_e2e_config
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.traces import load_mooncake
from speckv.services.common.errors import InvalidArgument

CONFIG = load_e2e_config()
SLICE_START_S, SLICE_S, HISTORY_S = 1200.0, 30.0, 120.0


@pytest.fixture(scope="module")
def trace(traces_dir):
    requests = load_mooncake(traces_dir / "mooncake_conversation_trace.jsonl", family=CONFIG.family,
                             start_s=SLICE_START_S - HISTORY_S, duration_s=HISTORY_S + SLICE_S)
    history = [r for r in requests if r.arrival_s < SLICE_START_S]
    requests = [r for r in requests if r.arrival_s >= SLICE_START_S]
    assert history and requests
    return history, requests


def simulate(predictor: str, history, requests):
    settings = dataclasses.replace(SimSettings.from_e2e(CONFIG, predictor=predictor), drain_s=120.0)
    return Simulation(CONFIG, settings, "predictive", requests, history).run()


def test_lightgbm_trains_on_the_history_before_the_slice_and_forecasts(trace):
    history, requests = trace
    run = simulate("lightgbm", history, requests)
    note = re.fullmatch(r"LightGBM trained on (\d+) arrivals in \[(\d+), (\d+)\] s \(.* to train\)", run.predictor)
    assert note, run.predictor
    trained_on, first, last = (int(g) for g in note.groups())
    assert trained_on == len(history)
    assert first >= SLICE_START_S - HISTORY_S and last <= SLICE_START_S  # never the slice itself
    assert all(r.served for r in run.records) and len(run.records) == len(requests)
    # The forecast log: polled through the slice, each a finite expected count of a known family.
    assert run.forecasts
    times = sorted({t for t, _, _ in run.forecasts})
    assert times[0] >= requests[0].arrival_s and len(times) >= SLICE_S - 2
    known = {r.family for r in history} | {r.family for r in requests}
    assert all(f in known and math.isfinite(c) and c >= 0 for _, f, c in run.forecasts)
    # The model is really in use: the builtin EWMA forecasts the same arrivals differently.
    builtin = simulate("builtin", history, requests)
    assert builtin.predictor == "builtin EWMA"
    assert [c for _, _, c in builtin.forecasts] != [c for _, _, c in run.forecasts]


def test_lightgbm_without_history_is_refused(trace):
    _, requests = trace
    with pytest.raises(InvalidArgument, match="before the slice"):
        simulate("lightgbm", [], requests)
