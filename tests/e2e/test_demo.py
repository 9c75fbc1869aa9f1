"""`speckv demo` runs the end-to-end comparison on a short real-trace slice."""
from __future__ import annotations

import json
import subprocess
import sys


def test_demo_compares_policies_on_a_real_trace_slice(tmp_path, traces_dir):
    out = tmp_path / "result.json"
    report = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "speckv.services.cli", "demo", "--traces", str(traces_dir), "--duration-s", "12",
         "--policies", "none,predictive", "--json", str(out), "--report", str(report)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert set(summary["policies"]) == {"none", "predictive"}
    for metrics in summary["policies"].values():
        assert metrics["served"] == metrics["requests"] > 0
    assert (report / "index.html").exists() and str(report / "index.html") in result.stdout
    assert "| none |" in result.stdout
