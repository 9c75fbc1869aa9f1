"""`speckv bench chaos --quick --json`: every case of the chaos suite (issue
23, item 6; docs/chaos.md) runs against a real mutual-TLS cluster and
behaves correctly. Figures (latencies, memory) are reported, never asserted."""
from __future__ import annotations

import json
import os
import subprocess
import sys

AREAS = {"identity", "dataplane", "limits", "decode", "load", "faults", "membership", "routing", "hygiene"}


def test_every_chaos_case_behaves_correctly(tmp_path):
    out = tmp_path / "chaos.json"
    run = subprocess.run([sys.executable, "-m", "speckv.services.cli", "bench", "chaos", "--quick", "--json",
                          str(out), "--run-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=600, env={**os.environ})
    assert out.exists(), run.stdout[-4000:] + run.stderr[-4000:]
    result = json.loads(out.read_text())
    areas = {a["area"]: a for a in result["areas"]}
    assert set(areas) == AREAS
    wrong = [f"{a['area']}/{c['name']}: expected {c['expected']}; observed {c['observed']}"
             for a in areas.values() for c in a["cases"] if not c["correct"]]
    assert wrong == [], "\n".join(wrong)
    for area in areas.values():
        assert area["tried"] == len(area["cases"]) == area["correct"] > 0
        assert all(c["expected"] and c["observed"] for c in area["cases"])
    assert run.returncode == 0, run.stdout[-4000:]
