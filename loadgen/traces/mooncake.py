"""Mooncake FAST'25 JSONL traces: one JSON object per line with `timestamp`
(ms from the trace start), `input_length`, `output_length` and `hash_ids`
(chained ids of 512-token blocks: sharing the id at position i means sharing
the whole prefix up to i).

Family: the first block id. In the conversation trace it is the shared
system-prompt block for most requests, so a family is a prompt template; the
finer conversation-level family comes with the predictor's loaders.
"""
from __future__ import annotations

import json
from pathlib import Path

from speckv.loadgen.traces.records import TraceFormatError, TraceRequest

MOONCAKE_BLOCK_TOKENS = 512


def load_mooncake(path: Path | str, start_s: float = 0.0, duration_s: float | None = None) -> list[TraceRequest]:
    """Requests with start_s <= arrival < start_s + duration_s, sorted by arrival."""
    requests: list[TraceRequest] = []
    end_s = float("inf") if duration_s is None else start_s + duration_s
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            request = _parse(path, number, line)
            if start_s <= request.arrival_s < end_s:
                requests.append(request)
    requests.sort(key=lambda r: r.arrival_s)
    return requests


def _parse(path: Path | str, number: int, line: str) -> TraceRequest:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, number, f"not JSON ({exc.msg})") from None
    try:
        timestamp_ms, prompt, output, hashes = (row["timestamp"], row["input_length"], row["output_length"],
                                                row["hash_ids"])
    except (KeyError, TypeError) as exc:
        raise TraceFormatError(path, number, f"missing field {exc}") from None
    if not isinstance(hashes, list) or not all(isinstance(h, int) and h >= 0 for h in hashes):
        raise TraceFormatError(path, number, "hash_ids must be a list of non-negative integers")
    for name, value in (("timestamp", timestamp_ms), ("input_length", prompt), ("output_length", output)):
        if not isinstance(value, int) or value < 0:
            raise TraceFormatError(path, number, f"{name}={value!r} must be a non-negative integer")
    family = str(hashes[0]) if hashes else f"len-{prompt}"
    return TraceRequest(timestamp_ms / 1000.0, prompt, output, tuple(hashes), MOONCAKE_BLOCK_TOKENS, family)
