"""`speckv demo` runs a short slice of the real trace simulated and live,
and prints one table saying which figures are which, then the report."""
from __future__ import annotations

import json
import subprocess
import sys


def test_demo_compares_policies_on_a_real_trace_slice(tmp_path, traces_dir):
    out = tmp_path / "result.json"
    report = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "speckv.services.cli", "demo", "--traces", str(traces_dir), "--duration-s", "12",
         "--policies", "none,reactive-heat,predictive", "--live", "none,predictive", "--json", str(out),
         "--report", str(report)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert not summary["workload"]["synthetic"]
    assert set(summary["simulated"]["policies"]) == {"none", "reactive-heat", "predictive"}
    assert set(summary["live"]["policies"]) == {"none", "predictive"}
    for run in ("simulated", "live"):
        for metrics in summary[run]["policies"].values():
            assert metrics["served"] == metrics["requests"] > 0
            low, high = metrics["ci95"]["ttft_p50_ms"]
            assert low <= metrics["ttft_p50_ms"] <= high
    assert (report / "index.html").exists()
    # The table, then the report's path, end the output; no trace hint, no library warning.
    assert "live, 95 % CI" in result.stdout and "simulated" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1] == f"report: {report / 'index.html'}"
    assert "No trace file" not in result.stdout and "Warning" not in result.stdout + result.stderr
