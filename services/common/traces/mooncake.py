"""Mooncake FAST'25 JSONL traces: one JSON object per line with `timestamp`
(ms from the trace start), `input_length`, `output_length` and `hash_ids`
(chained ids of 512-token blocks: sharing the id at position i means sharing
the whole prefix up to i).

Families (`family=`):
- "prefix" (default): the first block id. In the conversation trace it is
  block 0 for every request (a shared system prompt), so this family is the
  prompt template: one family for the whole trace.
- "conversation": the first two block ids, "<h0>/<h1>". Because ids are
  chained, two requests share h1 exactly when they share the whole prefix
  through block 1, so every later turn of a conversation (whose prompt is the
  earlier turns plus more) lands in the family of its first turn: the family
  is the conversation as its chain of hash_ids grows, keyed by its first
  non-shared block. Turns that share a long document also share h1, which is
  what a KV family should mean. A one-block request (and a first turn whose
  second block was still partial, so later turns got a new id for it) cannot
  be linked and stays in its own "<h0>" or new family.
"""
from __future__ import annotations

import json
from pathlib import Path

from speckv.services.common.traces.records import TraceFormatError, TraceRequest

MOONCAKE_BLOCK_TOKENS = 512


FAMILY_MODES = ("prefix", "conversation")


def load_mooncake(path: Path | str, start_s: float = 0.0, duration_s: float | None = None,
                  family: str = "prefix") -> list[TraceRequest]:
    """Requests with start_s <= arrival < start_s + duration_s, sorted by
    arrival; family is one of FAMILY_MODES (see the module docstring)."""
    if family not in FAMILY_MODES:
        raise ValueError(f"family={family!r}: expected one of {', '.join(FAMILY_MODES)}")
    requests: list[TraceRequest] = []
    end_s = float("inf") if duration_s is None else start_s + duration_s
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            request = _parse(path, number, line, family)
            if start_s <= request.arrival_s < end_s:
                requests.append(request)
    requests.sort(key=lambda r: r.arrival_s)
    return requests


def _parse(path: Path | str, number: int, line: str, mode: str) -> TraceRequest:
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
    depth = 2 if mode == "conversation" else 1
    family = "/".join(str(h) for h in hashes[:depth]) if hashes else f"len-{prompt}"
    return TraceRequest(timestamp_ms / 1000.0, prompt, output, tuple(hashes), MOONCAKE_BLOCK_TOKENS, family)
