"""`speckv simulate --predictor lightgbm`: a short real simulation on the
Mooncake conversation trace whose predictor is LightGBM trained, in the
simulator, on the trace before the slice only; and the CLI training it once,
on the base trace alone, for workers in other processes."""
from __future__ import annotations

import dataclasses
import json
import math
import pickle
import re

import numpy as np
import pytest

from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.sim import cli
from speckv.loadgen.sim.predictor import train_lightgbm, train_on_base
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.simulation import Simulation
from speckv.loadgen.workload.scaled import ScaledTrace
from speckv.services.common.errors import InvalidArgument, NotFound
from speckv.services.common.traces import load_mooncake
from tests.support.sim_slices import slice_with_history

CONFIG = load_e2e_config()
SLICE_START_S, SLICE_S, HISTORY_S = 1200.0, 30.0, 120.0
DESCRIPTION = r"LightGBM trained on (\d+) arrivals in \[(\d+), (\d+)\] s of (.+) \(.* to train\)"


@pytest.fixture(scope="module")
def trace(traces_dir):
    history, requests = slice_with_history(traces_dir, CONFIG.family, SLICE_START_S, SLICE_S, HISTORY_S)
    assert history and requests
    return history, requests


def simulate(predictor: str, history, requests, trained=None):
    settings = dataclasses.replace(SimSettings.from_e2e(CONFIG, predictor=predictor), drain_s=120.0)
    return Simulation(CONFIG, settings, "predictive", requests, history, trained=trained).run()


def test_lightgbm_trains_on_the_history_before_the_slice_and_forecasts(trace):
    history, requests = trace
    # Through a pickle, as a worker process gets it inside its Job.
    trained = pickle.loads(pickle.dumps(train_lightgbm(history, source="the slice's trace")))
    run = simulate("lightgbm", history, requests, trained)
    note = re.fullmatch(DESCRIPTION, run.predictor)
    assert note, run.predictor
    trained_on, first, last = (int(g) for g in note.groups()[:3])
    assert trained_on == len(history) and note.group(4) == "the slice's trace"
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


def test_lightgbm_without_history_or_model_is_refused(trace):
    history, requests = trace
    with pytest.raises(InvalidArgument, match="before the slice"):
        train_lightgbm([])
    with pytest.raises(InvalidArgument, match="trained before the slice"):
        simulate("lightgbm", history, requests)


def test_the_model_is_trained_on_copy_zero_alone(trace):
    """Two copies or one: the same requests train the same model."""
    history, requests = trace
    one, two = ScaledTrace(history + requests, 1), ScaledTrace(history + requests, 2)
    assert len(two) == 2 * len(one)
    a, b = train_on_base(one, SLICE_START_S, HISTORY_S), train_on_base(two, SLICE_START_S, HISTORY_S)
    assert a.description.split(" (")[0] == b.description.split(" (")[0]
    assert int(re.fullmatch(DESCRIPTION, a.description).group(1)) == len(history)
    for x, y in zip(a.model.bundle.boosters["count"], b.model.bundle.boosters["count"]):
        assert x.model_to_string() == y.model_to_string()


def test_simulate_trains_on_the_base_trace_and_says_what_on(traces_dir, tmp_path):
    """The CLI at twice the configuration's nodes (two copies), one worker
    process: the model is trained on the base trace's pre-slice requests
    only, and the notes say that copy 1's windows can overlap them."""
    path = traces_dir / "mooncake_conversation_trace.jsonl"
    nodes, start, out = 2 * CONFIG.nodes, 1800.0, tmp_path / "result.json"
    code = cli.main(["--trace", str(path), "--nodes", str(nodes), "--policies", "predictive", "--start-s",
                     str(start), "--duration-s", "5", "--predictor", "lightgbm", "--jobs", "1", "--json", str(out)],
                    {})
    assert code == 0
    result = json.loads(out.read_text())
    base = load_mooncake(path, family=CONFIG.family)
    times = np.array([r.arrival_s for r in base])
    pre_slice = int(np.count_nonzero((times >= start - CONFIG.warmup_s) & (times < start)))
    notes = result["by_nodes"][str(nodes)]["notes"]
    note = next(n for n in notes if n.startswith("Predictor: LightGBM"))
    assert f"trained on {pre_slice} arrivals" in note and "of the base trace" in note
    assert "Copies k > 0 are rotations of the base trace" in note and "partly seen" in note
    assert f"trained on {pre_slice} arrivals" in result["notes"][-1]  # the run's predictor description


def test_simulate_from_the_first_arrival_trains_on_another_trace(traces_dir, tmp_path):
    """--train-trace: a replay from the first arrival, with nothing before
    it, serves LightGBM trained on the whole of a different trace."""
    path, other = traces_dir / "mooncake_conversation_trace.jsonl", traces_dir / "mooncake_synthetic_trace.jsonl"
    out = tmp_path / "result.json"
    code = cli.main(["--trace", str(path), "--policies", "predictive", "--duration-s", "5", "--predictor",
                     "lightgbm", "--train-trace", str(other), "--jobs", "1", "--json", str(out)], {})
    assert code == 0
    result = json.loads(out.read_text())
    assert result["slice"]["start_s"] == 0.0
    note = next(n for n in result["by_nodes"][str(CONFIG.nodes)]["notes"] if n.startswith("Predictor: LightGBM"))
    trained_on = len(load_mooncake(other, family=CONFIG.family))
    assert f"trained on {trained_on} arrivals" in note and "mooncake_synthetic_trace.jsonl (a different trace" in note
    assert "seen none of the replayed trace" in note


@pytest.mark.parametrize("argv, error", [
    (["--train-trace", "x.jsonl"], InvalidArgument),  # without --predictor lightgbm
    (["--predictor", "lightgbm", "--train-trace", "/nonexistent.jsonl"], NotFound),
])
def test_simulate_refuses_a_bad_train_trace(traces_dir, argv, error):
    path = traces_dir / "mooncake_conversation_trace.jsonl"
    with pytest.raises(error):
        cli.main(["--trace", str(path), "--policies", "none", "--duration-s", "1", *argv], {})
