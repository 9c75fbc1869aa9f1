"""The most families the predictor tracks at once on the shipped traces
(docs/limits.md, `max_families_tracked`): a family is tracked while it has
an arrival in the last window_s (600 s, PredictorConfig), so the peak is
the most distinct families with an arrival in any 600 s of the trace,
counted per 1 s step, for the trace merged with its copies at N nodes as
the simulator does (loadgen/workload/scaled.py: ceil(N / 4) disjoint,
time-rotated copies), with the e2e configuration's conversation families.

    PYTHONPATH=. .venv/bin/python docs/scripts/predictor_families_peak.py [TRACES_DIR]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from speckv.loadgen.workload.scaled import ScaledTrace, copies_for
from speckv.services.common.traces.mooncake import load_mooncake

WINDOW_STEPS = 600  # window_s / step_s of PredictorConfig
BASE_NODES = 4  # services/config/e2e.json


def peak_tracked(families: np.ndarray, steps: np.ndarray) -> int:
    """Most distinct families with an arrival in the last WINDOW_STEPS steps,
    over every step: each arrival covers [step, min(next arrival of its
    family, step + W)), so the pieces of one family never overlap."""
    order = np.lexsort((steps, families))
    f, s = families[order], steps[order]
    end = s + WINDOW_STEPS
    same_next = np.r_[f[1:] == f[:-1], False]
    end[same_next] = np.minimum(end[same_next], s[1:][same_next[:-1]])
    delta = np.zeros(int(end.max()) - int(s.min()) + 2, dtype=np.int64)
    np.add.at(delta, s - s.min(), 1)
    np.add.at(delta, end - s.min(), -1)
    return int(np.cumsum(delta).max())


def main() -> None:
    traces = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/traces")
    for name in ("mooncake_conversation_trace.jsonl", "mooncake_synthetic_trace.jsonl"):
        base = load_mooncake(traces / name, family="conversation")
        names = {f: i for i, f in enumerate(dict.fromkeys(r.family for r in base))}
        ids = np.array([names[r.family] for r in sorted(base, key=lambda r: r.arrival_s)], dtype=np.int64)
        for nodes in (4, 256, 1024):
            scaled = ScaledTrace(base, copies_for(nodes, BASE_NODES))
            copy = scaled._copy.astype(np.int64)  # which copy each merged request is of (copies share no family)
            families = copy * len(names) + ids[scaled.base_rows(0, len(scaled))]
            steps = np.floor(scaled.times).astype(np.int64)
            print(f"{name:36s} {nodes:>5} nodes: {len(scaled):>9,} requests, {len(names) * scaled.copies:>9,} "
                  f"families, at most {peak_tracked(families, steps):>8,} tracked at once")


if __name__ == "__main__":
    main()
