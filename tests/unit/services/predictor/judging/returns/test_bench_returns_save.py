"""`speckv bench returns --save DIR` writes the evaluated model, trained
before the evaluated slice only, as a directory the predictor serves; the
live e2e bench's model (train_for_replay) is trained before its slice on the
replay's clock and warms the tracker with the history before it."""
from __future__ import annotations

import json

from speckv.loadgen.bench.returns import cli as bench
from speckv.loadgen.bench.e2e.run import cluster_spec
from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.loadgen.workload.replay import TimeMap
from speckv.services.common.clock import ManualClock
from speckv.services.common.traces.mooncake import load_mooncake
from speckv.services.predictor.fitting.returns.config import load_return_config
from speckv.services.predictor.fitting.returns.dataset import Split, build_rows
from speckv.services.predictor.fitting.returns.turns import build_turns
from speckv.services.predictor.judging.returns import evaluation
from speckv.services.predictor.serving.returns.serving import ReturnsCore, ReturnsSettings
from speckv.services.predictor.serving.returns.store import load_return_model, read_past_turns
from tests.support.returns_conversations import conversations, write_mooncake


def test_save_writes_the_model_trained_before_the_evaluated_slice(tmp_path, capsys):
    trace = write_mooncake(conversations(400, 3600.0, seed=5), tmp_path / "synthetic.jsonl")
    out, saved = tmp_path / "returns.json", tmp_path / "model"
    assert bench.main(["--traces", str(tmp_path), "--trace", "synthetic.jsonl", "--quick", "--json", str(out),
                       "--save", str(saved)], {}) == 0
    report = json.loads(out.read_text())
    loaded = load_return_model(saved)
    assert report["saved"] == {"directory": str(saved), "version": loaded.version}
    assert loaded.model.extra["until_s"] == report["eval_start_s"]
    assert [f.trees for f in loaded.model.fits] == [f["trees"] for f in report["training"]]
    # what it predicts on the evaluated rows is what the bench scored
    config = load_return_config(quick=True)
    requests = load_mooncake(trace, family="conversation")
    rows = build_rows(build_turns(requests, config.service), config.features)
    split = Split.of(min(r.arrival_s for r in requests), max(r.arrival_s for r in requests), config.eval_fraction)
    test = split.evaluated(rows)
    known, labels = test.known(config.horizons_s, split.data_end_s), test.labels(config.horizons_s)
    p = loaded.model.predict_cdf(test.X)
    i = config.horizons_s.index(300.0)
    score = evaluation.score(p[known[:, i], i], labels[known[:, i], i])
    assert score["auc"] == report["models"]["lightgbm"]["h300"]["auc"]
    assert loaded.recalibration == config.recalibration  # the served tracker recalibrates as configured
    assert "speckv predictor --returns-model" in capsys.readouterr().out


def test_the_replay_model_is_trained_before_the_slice_and_warms_the_tracker(tmp_path):
    requests = conversations(400, 3600.0, seed=6)
    start, speed = 2400.0, 2.0
    replay = bench.train_for_replay(requests, start, speed, tmp_path / "model")
    assert replay is not None and all(r.arrival_s < start for r in replay.history)
    loaded = load_return_model(replay.directory)
    assert loaded.version == replay.version and loaded.model.extra["until_s"] == start / speed
    configured = load_return_config().recalibration
    assert loaded.recalibration == configured.scaled(speed)  # its window on the replay's clock
    unix = TimeMap(1_000_000.0, start, speed)
    args = replay.predictor_args(unix.to_clock, tmp_path / "warm.jsonl")
    assert args == ["--returns-model", str(replay.directory), "--returns-warm", str(tmp_path / "warm.jsonl")]
    turns = read_past_turns(tmp_path / "warm.jsonl")
    assert len(turns) == len(replay.history)
    assert all(t.arrival_s < unix.origin and (t.end_s is None or t.arrival_s <= t.end_s < unix.origin)
               for t in turns)
    assert turns[0].arrival_s == unix.to_clock(replay.history[0].arrival_s)
    returns = ReturnsCore(ManualClock(unix.origin), ReturnsSettings(), loaded)
    assert returns.warm(turns) == sum(t.end_s is not None for t in turns)
    answer = returns.forecast(15.0)
    assert answer.open_conversations > 10 and answer.probabilities[0] > 0.05
    assert bench.train_for_replay(requests, 100.0, speed, tmp_path / "none") is None  # too little history


def test_the_predictor_gets_the_return_flags_in_the_cluster_spec(tmp_path):
    config = load_e2e_config()
    spec = cluster_spec(config, tmp_path / "oracle.jsonl", 0.0, 2.0,
                        predictor_args=["--returns-model", "/m", "--returns-warm", "/w"])
    assert spec.extra_args["predictor"][:4] == ["--returns-model", "/m", "--returns-warm", "/w"]
    assert cluster_spec(config, tmp_path / "oracle.jsonl", 0.0, 2.0).extra_args["predictor"] == []
