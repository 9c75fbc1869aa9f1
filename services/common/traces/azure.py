"""Azure LLM inference CSV traces (Splitwise, 2023): a header row
`TIMESTAMP,ContextTokens,GeneratedTokens`, one request per row, sorted by time.
TIMESTAMP is `YYYY-MM-DD HH:MM:SS.fffffff` (100 ns ticks, no zone).

Family: the trace carries no prompt text, hash ids or session ids, so there is
no prefix information to group by. Every request gets one family named for the
service (`azure-code`, `azure-conv`: the file stem after the
`AzureLLMInferenceTrace_` prefix). A service-wide family is what a real
router could key on (a deployment's shared system prompt), and any finer split
(by prompt length, say) would invent a structure the data does not show.
Arrival times are seconds since the first request; `time_of_day_s(path)` gives
the wall-clock second of day of that first request for time-of-day features.
"""
from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

from speckv.services.common.traces.records import TraceFormatError, TraceRequest

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
FAMILY_PREFIX = "azure-"


def load_azure(path: Path | str, start_s: float = 0.0, duration_s: float | None = None) -> list[TraceRequest]:
    """Requests with start_s <= arrival < start_s + duration_s (seconds from
    the first row), sorted by arrival."""
    end_s = float("inf") if duration_s is None else start_s + duration_s
    family = azure_family(path)
    stamps = _read(path)
    if not stamps:
        return []
    origin = stamps[0][1]
    requests = [TraceRequest(t - origin, prompt, output, (), 0, family) for _, t, prompt, output in stamps]
    requests = [r for r in requests if start_s <= r.arrival_s < end_s]
    requests.sort(key=lambda r: r.arrival_s)
    return requests


def azure_family(path: Path | str) -> str:
    stem = Path(path).stem
    return FAMILY_PREFIX + (stem.split("_", 1)[1] if "_" in stem else stem).lower()


def time_of_day_s(path: Path | str) -> float:
    """Second of day (0..86400) of the trace's first request."""
    stamps = _read(path, limit=1)
    if not stamps:
        return 0.0
    return stamps[0][1] % 86_400.0


def parse_timestamp(text: str) -> float:
    """`YYYY-MM-DD HH:MM:SS[.fffffff]` -> POSIX seconds (UTC assumed). The
    fraction is parsed separately: datetime takes at most 6 digits."""
    whole, _, fraction = text.strip().partition(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    if fraction and not fraction.isdigit():
        raise ValueError(text)
    seconds = (base - datetime(1970, 1, 1)).total_seconds()
    return seconds + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def _read(path: Path | str, limit: int | None = None) -> list[tuple[int, float, int, int]]:
    rows: list[tuple[int, float, int, int]] = []
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            return rows
        if tuple(h.strip() for h in header) != AZURE_COLUMNS:
            raise TraceFormatError(path, 1, f"header {header!r}: expected {','.join(AZURE_COLUMNS)}")
        for row in reader:
            number = reader.line_num
            if not row:
                continue
            rows.append(_parse(path, number, row))
            if limit is not None and len(rows) >= limit:
                break
    return rows


def _parse(path: Path | str, number: int, row: list[str]) -> tuple[int, float, int, int]:
    if len(row) != len(AZURE_COLUMNS):
        raise TraceFormatError(path, number, f"{len(row)} columns, expected {len(AZURE_COLUMNS)}")
    try:
        stamp = parse_timestamp(row[0])
    except ValueError:
        raise TraceFormatError(path, number, f"TIMESTAMP={row[0]!r}: expected YYYY-MM-DD HH:MM:SS.fffffff") from None
    values = []
    for name, text in zip(AZURE_COLUMNS[1:], row[1:]):
        try:
            value = int(text)
        except ValueError:
            raise TraceFormatError(path, number, f"{name}={text!r}: not an integer") from None
        if value < 0:
            raise TraceFormatError(path, number, f"{name}={value}: must be >= 0")
        values.append(value)
    return number, stamp, values[0], values[1]
