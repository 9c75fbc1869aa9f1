"""Trace loading: one request record type out of every public trace format.

Traces are never shipped with speckv; they are read from a directory chosen by
`--traces`, else SPECKV_TRACES, else ../shared/traces (see README for where the
public traces come from). Formats: Mooncake JSONL (mooncake.py), Azure LLM
inference CSV (azure.py), BurstGPT CSV (burstgpt.py); `load_trace` picks by file.
"""
from speckv.services.common.traces.azure import load_azure
from speckv.services.common.traces.burstgpt import load_burstgpt
from speckv.services.common.traces.loader import load_trace, trace_format
from speckv.services.common.traces.mooncake import load_mooncake
from speckv.services.common.traces.records import TraceFormatError, TraceRequest, resolve_traces_dir

__all__ = ["TraceRequest", "TraceFormatError", "resolve_traces_dir", "load_mooncake", "load_azure",
           "load_burstgpt", "load_trace", "trace_format"]
