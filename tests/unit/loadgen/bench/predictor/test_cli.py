"""`speckv bench predictor` over several workloads: which ones run, where the
traces directory comes from, coarse timestamps respected, one report each."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from speckv.loadgen.bench.predictor import cli as predictor
from speckv.loadgen.bench.predictor.run import timestamp_resolution_s
from speckv.services.common.errors import NotFound

SCENARIO = {"scenarios": {"tiny": {"generator": "mmpp", "note": "test",
                                   "params": {"duration_s": 900.0, "rate_calm": 2.0, "rate_burst": 12.0,
                                              "calm_s": 40.0, "burst_s": 6.0, "burst_focus": 0.9},
                                   "shape": {"families": 4, "prefix_blocks": 2, "max_suffix_blocks": 1}}}}


def _mooncake(path: Path, period_ms: int, seed: int) -> Path:
    """Requests of 3 conversations stamped on a period_ms grid, as the Mooncake conversation trace is on ~3 s."""
    rng = np.random.default_rng(seed)
    lines = []
    for k in range(int(900_000 / period_ms)):
        for _ in range(int(rng.poisson(3))):
            c = int(rng.integers(0, 3))
            lines.append(json.dumps({"timestamp": k * period_ms, "input_length": 1024, "output_length": 10,
                                     "hash_ids": [c * 10 + 1, c * 10 + 2]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _azure(path: Path) -> Path:
    rows = [f"2023-11-16 18:17:{s:02d}.{i:07d},100,10" for s in range(3, 30) for i in (0, 5_000_000)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture
def setup(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    _mooncake(traces / "b_quantised.jsonl", 3000, 1)
    _azure(traces / "a_azure.csv")
    (traces / "README.md").write_text("not a trace")
    (traces / "notes.csv").write_text("col,other\n1,2\n")  # a CSV in no known format
    scenarios = tmp_path / "scenarios.json"
    scenarios.write_text(json.dumps(SCENARIO))
    return traces, scenarios


@pytest.mark.parametrize("how", ["flag", "env", "both"])
def test_every_known_trace_then_every_scenario_runs_from_the_traces_directory(setup, tmp_path, how):
    traces, scenarios = setup
    other = tmp_path / "elsewhere"
    other.mkdir()
    flag = ["--traces", str(traces)] if how != "env" else []
    environ = {"SPECKV_TRACES": str(traces if how == "env" else other)}
    args = predictor._parse([*flag, "--scenarios", str(scenarios)])  # noqa: SLF001
    names = [w.name for w, _ in predictor._workloads(args, environ)]  # noqa: SLF001
    assert names == ["a_azure.csv", "b_quantised.jsonl", "synthetic:tiny"]


def test_a_missing_traces_directory_is_named(tmp_path):
    args = predictor._parse(["--traces", str(tmp_path / "none")])  # noqa: SLF001
    with pytest.raises(NotFound, match="none"):
        list(predictor._workloads(args, {}))  # noqa: SLF001


def test_the_default_traces_directory_sits_beside_the_project_root():
    assert predictor.PROJECT_ROOT / ".." / "shared" / "traces" == Path(predictor.__file__).resolve().parents[3] \
        / ".." / "shared" / "traces"
    assert (predictor.PROJECT_ROOT / "services" / "predictor").is_dir()


@pytest.mark.parametrize("period_ms,expected", [(3000, 3.0), (1, 0.001)])
def test_the_timestamp_resolution_is_the_grid_the_trace_is_stamped_on(tmp_path, period_ms, expected):
    from speckv.services.common.traces import load_trace

    if period_ms == 1:
        times = np.sort(np.random.default_rng(0).uniform(0, 100, 5000).round(3))
    else:
        times = np.array([r.arrival_s for r in load_trace(_mooncake(tmp_path / "q.jsonl", period_ms, 2))])
    assert timestamp_resolution_s(times) == pytest.approx(expected, rel=0.01)


def test_one_report_per_workload_with_coarse_bins_where_the_data_is_coarse(setup, tmp_path, capsys):
    traces, scenarios = setup
    (traces / "a_azure.csv").unlink()  # too short to train on
    out = tmp_path / "out.json"
    assert predictor.main(["--all", "--traces", str(traces), "--scenarios", str(scenarios), "--quick",
                           "--no-latency", "--json", str(out)], {}) == 0
    reports = json.loads(out.read_text())["reports"]
    assert [r["trace"] for r in reports] == ["b_quantised.jsonl", "synthetic:tiny"]
    quantised, synthetic = reports
    assert quantised["step_s"] == 3.0 and quantised["horizons_s"] == [3.0, 6.0, 12.0]
    assert synthetic["step_s"] == 1.0 and synthetic["horizons_s"] == [1.0, 2.0, 5.0, 10.0]
    for r in reports:
        for h in r["horizons_s"]:
            s = r["summary"][f"h{h:g}"]
            assert {"served_mae", "served_median_ae", "ratio", "burst_precision", "burst_recall", "lead_time_s",
                    "lead_mean_s", "burst_early"} <= set(s)
            assert {"last-value", "ewma", "seasonal-naive", "arima", "served"} <= set(r["models"])
        assert r["train_s"] > 0 and r["latency"] is None
    printed = capsys.readouterr().out
    assert printed.count("\n== ") == 3 and "overview" in printed  # two workloads and the overview
    # Latency was not run: said so, never printed as 0.00 ms (its JSON is null)
    assert printed.count("Forecast latency: not run") == 2
    overview = printed[printed.index("== overview"):].splitlines()[2:]
    firsts = [line for line in overview
              if line.startswith(("b_quantised", "synthetic")) and "(latency not run)" in line]
    assert len(firsts) == 2 and all(line.rstrip().endswith("(latency not run)") for line in firsts)


LATENCY = {"inference": "compiled", "compile_s": 1.0, "identical": True,
           "forecast_ms": {"compiled": {"1": 1.1, "1000": 7.1, "10000": 27.0},
                           "lightgbm": {"1": 1.0, "1000": 13.5, "10000": 57.0}},
           "forecast_cpu_ms_10k": {"compiled": 46.0, "lightgbm": 105.0},
           "breakdown_ms_10k": {"features": 3.0, "count_trees": 6.0, "level_free": 12.8, "distribution": 17.4,
                                "burst_trees": 0.0, "predict": 40.0, "forecast_one_thread": 43.5},
           "breakdown_derived_ms_10k": {"model_rest": 3.8, "core_rest": 0.5}}


def test_the_latency_report_prints_timed_parts_apart_from_the_derived_remainders(capsys):
    predictor._print_latency(LATENCY)  # noqa: SLF001
    lines = capsys.readouterr().out.splitlines()
    timed = next(line for line in lines if "each timed alone" in line)
    derived = next(line for line in lines if "derived, not timed" in line)
    assert "forecast 43.5 ms" in timed and "features 3.0" in timed and "the model's predict 40.0" in timed
    assert "0.5" not in timed and "3.8" not in timed and "rest" not in timed  # remainders are not parts
    assert "core outside the model and features 0.5" in derived and "model outside its timed parts 3.8" in derived
    predictor._print_overview([{"trace": "t", "horizons_s": [1.0], "train_s": 2.0, "latency": LATENCY,  # noqa: SLF001
                                "summary": {"h1": {"ratio": 0.9, "best_baseline": "ewma", "served_median_ae": 1.0,
                                                   "burst_precision": None, "burst_recall": None,
                                                   "lead_time_s": None, "lead_mean_s": None, "burst_early": None,
                                                   "burst_episodes": 0}}}], 1.0)
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.split()[-3:] == ["1.10", "7.10", "27.00"]
