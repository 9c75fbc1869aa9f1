"""`speckv demo` replays a real trace slice on a fresh local cluster."""
from __future__ import annotations

import json
import subprocess
import sys


def test_demo_replays_a_real_trace_slice(tmp_path, traces_dir):
    summary_path = tmp_path / "summary.json"
    result = subprocess.run(
        [sys.executable, "-m", "speckv.services.cli", "demo", "--traces", str(traces_dir), "--duration-s", "30",
         "--speed", "10", "--nodes", "2", "--json", str(summary_path)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["requests"] > 0 and summary["errors"] == 0
    assert summary["blocks_stored"] > 0
    # The conversation trace shares its system-prompt block across requests,
    # so KV-aware routing must find some prefix already cached.
    assert summary["prefix_hit_ratio"] > 0
    assert sum(summary["per_node"].values()) == summary["requests"]
