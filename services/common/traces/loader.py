"""One entry point for every trace format: `load_trace(path, family=...)`.

The format is told by the file: `.jsonl` is Mooncake; a `.csv` whose header
starts with TIMESTAMP is Azure; a `.csv` with a `Log Type` column is BurstGPT.
`family` picks the family assignment where a format has more than one
("prefix" or "conversation" for Mooncake; Azure and BurstGPT have one each,
see their modules); "auto" takes the finest one the format supports.
"""
from __future__ import annotations

from pathlib import Path

from speckv.services.common.traces.azure import load_azure
from speckv.services.common.traces.burstgpt import load_burstgpt
from speckv.services.common.traces.mooncake import load_mooncake
from speckv.services.common.traces.records import TraceFormatError, TraceRequest

FAMILY_CHOICES = ("auto", "prefix", "conversation", "service")


def trace_format(path: Path | str) -> str:
    """"mooncake", "azure" or "burstgpt"; TraceFormatError when unknown."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return "mooncake"
    if path.suffix == ".csv":
        with open(path, encoding="utf-8") as handle:
            header = handle.readline()
        if header.startswith("TIMESTAMP"):
            return "azure"
        if "Log Type" in header:
            return "burstgpt"
    raise TraceFormatError(path, 1, "unknown trace format (expected Mooncake .jsonl, Azure or BurstGPT .csv)")


def load_trace(path: Path | str, family: str = "auto") -> list[TraceRequest]:
    if family not in FAMILY_CHOICES:
        raise ValueError(f"family={family!r}: expected one of {', '.join(FAMILY_CHOICES)}")
    kind = trace_format(path)
    if kind == "mooncake":
        return load_mooncake(path, family="conversation" if family in ("auto", "conversation") else "prefix")
    if family not in ("auto", "service"):
        raise ValueError(f"family={family!r}: {kind} traces carry no prefix information; use auto or service")
    return load_azure(path) if kind == "azure" else load_burstgpt(path)
