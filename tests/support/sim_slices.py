"""A slice of the Mooncake conversation trace with the history before it,
as a Simulation takes them (history routed at the slice's start)."""
from __future__ import annotations

from pathlib import Path

from speckv.services.common.traces import TraceRequest, load_mooncake


def slice_with_history(traces_dir: Path, family: str, start_s: float, duration_s: float,
                       history_s: float) -> tuple[list[TraceRequest], list[TraceRequest]]:
    """(requests in [start_s - history_s, start_s), requests in [start_s, start_s + duration_s))."""
    requests = load_mooncake(traces_dir / "mooncake_conversation_trace.jsonl", family=family,
                             start_s=start_s - history_s, duration_s=history_s + duration_s)
    history = [r for r in requests if r.arrival_s < start_s]
    return history, [r for r in requests if r.arrival_s >= start_s]
