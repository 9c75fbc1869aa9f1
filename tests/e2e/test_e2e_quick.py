"""`speckv bench e2e`: the live quick comparison runs end to end (twice per
policy, round-robin, with the between-runs table), and a policy the
scheduler rejects fails loudly."""
from __future__ import annotations

import json
import subprocess
import sys

KEYS = {"ttft_p50_ms", "ttft_p99_ms", "burst_ttft_p99_ms", "slo_attainment", "bytes_replicated",
        "replica_hit_ratio", "wasted_bytes_ratio"}


def _bench(traces_dir, *args):
    return subprocess.run([sys.executable, "-m", "speckv.services.cli", "bench", "e2e", "--trace",
                           str(traces_dir / "mooncake_conversation_trace.jsonl"), *args],
                          capture_output=True, text=True, timeout=600)


def test_quick_comparison_runs_end_to_end(tmp_path, traces_dir):
    out = tmp_path / "e2e.json"
    result = _bench(traces_dir, "--policies", "none,reactive-heat", "--quick", "--duration-s", "12", "--repeats", "2",
                    "--json", str(out), "--report", str(tmp_path / "report"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["byte_scale_factor"] == 1024
    for name in ("none", "reactive-heat"):
        metrics = data["policies"][name]
        assert KEYS <= set(metrics)
        assert metrics["requests"] > 0 and metrics["errors"] == 0
        assert metrics["ttft_p50_ms"] > 0 and 0 <= metrics["slo_attainment"] <= 1
        # Both rounds' figures, the summary's own round first.
        assert len(metrics["repeats"]["ttft_p50_ms"]) == 2
        assert metrics["repeats"]["ttft_p50_ms"][0] == metrics["ttft_p50_ms"]
    # Routing is KV-aware: conversation turns find their earlier prefix.
    assert data["policies"]["none"]["prefix_hit_ratio"] > 0
    assert data["policies"]["none"]["bytes_replicated"] == 0
    assert data["policies"]["none"]["actions"] is None  # no forecast, no placement: no order
    for metrics in data["policies"].values():  # the scheduler's outcome totals, split by forecast
        for stats in (metrics["actions"] or {}).values():
            split = stats["by_forecast"].values()
            assert sum(s["orders"] for s in split) == stats["orders"]
            assert sum(s["bytes"] for s in split) == stats["bytes"]
    assert "between 2 runs of each policy" in result.stdout
    assert "| reactive-heat | ttft_p50_ms | 2 |" in result.stdout
    assert any(note.startswith("Repeats: every policy replayed the slice 2 times") for note in data["notes"])
    html = (tmp_path / "report" / "index.html").read_text()
    assert "data:image/png;base64," in html and "ttft_cdf.png" in html
    assert "<th>none mean</th>" in html  # the between-runs table


def test_a_policy_the_scheduler_rejects_fails_loudly(tmp_path, traces_dir):
    result = _bench(traces_dir, "--policies", "no-such-policy,none", "--quick", "--duration-s", "6")
    assert result.returncode != 0
    assert "no-such-policy" in result.stderr + result.stdout
