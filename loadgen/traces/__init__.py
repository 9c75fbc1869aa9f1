"""Trace loading: one request record type out of every public trace format.

Traces are never shipped with speckv; they are read from a directory chosen by
`--traces`, else SPECKV_TRACES, else ../shared/traces (see README for where the
public traces come from).
"""
from speckv.loadgen.traces.records import TraceRequest, TraceFormatError, resolve_traces_dir
from speckv.loadgen.traces.mooncake import load_mooncake

__all__ = ["TraceRequest", "TraceFormatError", "resolve_traces_dir", "load_mooncake"]
