"""`speckv bench returns` end to end on a small synthetic trace (and on the
real one when the traces directory is there)."""
from __future__ import annotations

import json

from speckv.loadgen.bench.returns import cli as bench
from tests.support.returns_conversations import conversations, write_mooncake

REPORT_KEYS = {"trace", "quick", "requests", "conversations", "turns", "overlapped_turns", "rows", "horizons_s",
               "eval_start_s", "data_end_s", "features", "training", "features_s", "train_s", "train_cpu_s",
               "predict_us_per_row_batch", "predict_us_single_row", "models", "calibration_horizon_s",
               "calibration", "target", "notes", "tail", "tracker", "recalibration"}
MODELS = {"lightgbm", "lgb+recal", "constant", "by_turn", "by_gap"}


def _check(report: dict) -> None:
    assert REPORT_KEYS <= set(report)
    assert set(report["models"]) == MODELS and set(report["calibration"]) == MODELS
    for per in report["models"].values():
        assert set(per) == {f"h{h:g}" for h in report["horizons_s"]}
        assert all({"rows", "base_rate", "auc", "brier", "ece"} <= set(m) for m in per.values())
    assert report["calibration_horizon_s"] == 300.0
    assert {"auc_min", "ece_max", "auc_met", "ece_met"} <= set(report["target"])
    tracker = report["tracker"]
    assert set(tracker["conditional"]) == {"lightgbm", "lgb+recal", "constant"} and tracker["snapshots"] > 0
    assert report["target"]["model"] == ("lgb+recal" if report["recalibration"]["enabled"] else "lightgbm")
    assert set(tracker["conditional"]["lightgbm"]) == {f"h{h:g}" for h in report["horizons_s"]}


def test_bench_runs_on_a_synthetic_trace_and_writes_json(tmp_path, capsys):
    write_mooncake(conversations(400, 3600.0, seed=5), tmp_path / "synthetic.jsonl")
    out = tmp_path / "returns.json"
    assert bench.main(["--traces", str(tmp_path), "--trace", "synthetic.jsonl", "--quick", "--json", str(out)],
                      {}) == 0
    report = json.loads(out.read_text())
    _check(report)
    assert report["requests"] == len((tmp_path / "synthetic.jsonl").read_text().splitlines())
    printed = capsys.readouterr().out
    assert "calibration at 300 s" in printed and "quantised" in printed


def test_bench_on_the_real_trace_quick(tmp_path, traces_dir):
    out = tmp_path / "returns.json"
    assert bench.main(["--traces", str(traces_dir), "--quick", "--json", str(out)], {}) == 0
    report = json.loads(out.read_text())
    _check(report)
    assert report["requests"] == 12_031
