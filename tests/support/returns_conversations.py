"""Small synthetic conversations for the session-return tests (no real trace).

Conversations start as a Poisson stream; each has a hidden engagement level
that sets both its prompt size and its think time, so returns are somewhat
predictable from what is known at a turn's end.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from speckv.services.common.traces.records import TraceRequest


def conversations(n: int = 300, duration_s: float = 3600.0, seed: int = 0) -> list[TraceRequest]:
    """Requests of n conversations over duration_s, sorted by arrival; family
    "c<k>" is conversation k; block_hashes (0, k + 1, ...) like Mooncake."""
    rng = np.random.default_rng(seed)
    out: list[TraceRequest] = []
    for k in range(n):
        t = float(rng.uniform(0.0, duration_s))
        engaged = rng.random() < 0.5
        prompt = int(rng.integers(600, 4000)) * (3 if engaged else 1)
        turns = int(rng.geometric(0.25 if engaged else 0.6))
        for _ in range(turns):
            if t >= duration_s:
                break
            t = round(t / 3.0) * 3.0  # ~3 s quantisation like Mooncake
            output = int(rng.integers(20, 600))
            blocks = max(2, math.ceil(prompt / 512))
            base = 10_000 * (k + 1)
            out.append(TraceRequest(t, prompt, output, (0, k + 1, *range(base, base + blocks - 2)), 512, f"c{k}"))
            t += output * 0.02 + float(rng.exponential(60.0 if engaged else 400.0)) + 5.0
            prompt += output + int(rng.integers(50, 800))
    out.sort(key=lambda r: (r.arrival_s, r.family))
    return out


def write_mooncake(requests: list[TraceRequest], path: Path) -> Path:
    """The requests as a Mooncake JSONL trace (timestamps in ms)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps({"timestamp": round(r.arrival_s * 1000), "input_length": r.prompt_tokens,
                                "output_length": r.output_tokens, "hash_ids": list(r.block_hashes)}) + "\n")
    return path
