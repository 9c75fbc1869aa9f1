"""`speckv demo` on the real trace: the verdict, simulated over a window of
several bursts, and the live check, a short slice simulated and live; one
table each, saying which figures are which, then the report."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


# The verdict's simulations come on top of the two live clusters, so this test gets twice the suite's timeout.
@pytest.mark.timeout(600)
def test_demo_gives_a_simulated_verdict_over_several_bursts_and_a_live_check(tmp_path, traces_dir):
    out = tmp_path / "result.json"
    report = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "speckv.services.cli", "demo", "--traces", str(traces_dir), "--duration-s", "12",
         "--verdict-s", "60", "--policies", "none,reactive-heat,predictive", "--live", "none,predictive",
         "--json", str(out), "--report", str(report)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert not summary["workload"]["synthetic"]
    verdict = summary["verdict"]
    assert verdict["seeds"] == [] and "paired" in verdict["interval"]  # one trace: one realization
    (run,) = verdict["runs"]
    assert run["bursts"] >= 2 and set(run["policies"]) == {"none", "reactive-heat", "predictive"}
    assert verdict["window"]["duration_s"] == 60
    assert verdict["window"]["start_s"] == summary["workload"]["slice"]["start_s"]
    assert {v["policy"]: v["verdict"] for v in verdict["verdicts"]}["none"] == "baseline"
    # The live check: the live policies, simulated on the slice and live.
    assert set(summary["simulated"]["policies"]) == set(summary["live"]["policies"]) == {"none", "predictive"}
    for figures in (summary["simulated"], summary["live"], run):
        for metrics in figures["policies"].values():
            assert metrics["served"] == metrics["requests"] > 0
            low, high = metrics["ci95"]["ttft_p50_ms"]
            assert low <= metrics["ttft_p50_ms"] <= high
    page = (report / "index.html").read_text()
    assert "Verdict (simulated)" in page and "Live check" in page
    # Both tables, titled (the verdict first: it is ready before the live runs), then the report's path end
    # the output; no trace hint, no library warning.
    assert "live, 95 % CI" in result.stdout
    assert result.stdout.index("Verdict (simulated)") < result.stdout.index("live, 95 % CI")
    assert result.stdout.rstrip().splitlines()[-1] == f"report: {report / 'index.html'}"
    assert "No trace file" not in result.stdout and "Warning" not in result.stdout + result.stderr
