"""BurstGPT CSV traces (HPMLL/BurstGPT): a header with at least the columns
`Timestamp` (seconds from the trace start), `Model`, `Request tokens`,
`Response tokens`, `Total tokens` and `Log Type`; one request per row.

Family: BurstGPT has no prompt text or hash ids either, but it does say which
model served the request and whether it came through the conversation UI or
the API (`Log Type`). Requests to one model through one channel share that
deployment's system prompt and tenant mix, so the family is
`burstgpt-<Model>-<Log Type>` (lower case, spaces as dashes). Rows with
`Response tokens` = 0 are failed requests in BurstGPT; they still arrived, so
they are kept.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from speckv.services.common.traces.records import TraceFormatError, TraceRequest

BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")


def load_burstgpt(path: Path | str, start_s: float = 0.0, duration_s: float | None = None) -> list[TraceRequest]:
    """Requests with start_s <= Timestamp < start_s + duration_s, sorted by arrival."""
    end_s = float("inf") if duration_s is None else start_s + duration_s
    requests: list[TraceRequest] = []
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in BURSTGPT_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceFormatError(path, 1, f"header lacks column(s) {', '.join(missing)}")
        for row in reader:
            request = _parse(path, reader.line_num, row)
            if start_s <= request.arrival_s < end_s:
                requests.append(request)
    requests.sort(key=lambda r: r.arrival_s)
    return requests


def burstgpt_family(model: str, log_type: str) -> str:
    return "burstgpt-" + "-".join(f"{model} {log_type}".lower().split())


def _parse(path: Path | str, number: int, row: dict[str, str | None]) -> TraceRequest:
    if None in row or any(row.get(c) is None for c in BURSTGPT_COLUMNS):
        raise TraceFormatError(path, number, f"expected {len(BURSTGPT_COLUMNS)} columns")
    try:
        arrival = float(row["Timestamp"] or "")
    except ValueError:
        raise TraceFormatError(path, number, f"Timestamp={row['Timestamp']!r}: not a number") from None
    if not (math.isfinite(arrival) and arrival >= 0):
        raise TraceFormatError(path, number, f"Timestamp={arrival!r}: must be finite and >= 0")
    tokens = {}
    for name in ("Request tokens", "Response tokens", "Total tokens"):
        text = row[name] or ""
        try:
            tokens[name] = int(text)
        except ValueError:
            raise TraceFormatError(path, number, f"{name}={text!r}: not an integer") from None
        if tokens[name] < 0:
            raise TraceFormatError(path, number, f"{name}={tokens[name]}: must be >= 0")
    model, log_type = (row["Model"] or "").strip(), (row["Log Type"] or "").strip()
    if not model or not log_type:
        raise TraceFormatError(path, number, "Model and Log Type must be non-empty")
    return TraceRequest(arrival, tokens["Request tokens"], tokens["Response tokens"], (), 0,
                        burstgpt_family(model, log_type))
