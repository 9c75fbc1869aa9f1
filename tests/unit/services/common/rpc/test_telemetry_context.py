"""A process that exports no traces records no server spans, yet runs each
call in its caller's trace context, so the calls it makes carry the trace on
(services/common/rpc/telemetry.py)."""
from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from speckv.services.common.rpc.telemetry import ContextOnlyInterceptor, build_telemetry

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
TRACEPARENT = f"00-{TRACE_ID:032x}-00f067aa0ba902b7-01"


def _trace_id() -> bytes:
    return b"%032x" % trace.get_current_span().get_span_context().trace_id


@pytest.fixture
def channel():
    telemetry = build_telemetry("test", {})
    handlers = grpc.method_handlers_generic_handler("t.T", {
        "Unary": grpc.unary_unary_rpc_method_handler(lambda request, context: _trace_id()),
        "Stream": grpc.unary_stream_rpc_method_handler(lambda request, context: iter([_trace_id()] * 2)),
    })
    server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[telemetry.server_interceptor()])
    server.add_generic_rpc_handlers((handlers,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            yield ch
    finally:
        server.stop(0)


def test_no_exporter_means_no_server_spans_but_an_exporter_keeps_them():
    assert isinstance(build_telemetry("test", {}).server_interceptor(), ContextOnlyInterceptor)
    exported = build_telemetry("test", {}, (SimpleSpanProcessor(InMemorySpanExporter()),))
    assert exported.traces_exported and not isinstance(exported.server_interceptor(), ContextOnlyInterceptor)


def test_a_traced_call_runs_in_its_caller_s_trace(channel):
    metadata = (("traceparent", TRACEPARENT),)
    assert channel.unary_unary("/t.T/Unary")(b"", metadata=metadata, timeout=5) == b"%032x" % TRACE_ID
    assert list(channel.unary_stream("/t.T/Stream")(b"", metadata=metadata, timeout=5)) == [b"%032x" % TRACE_ID] * 2


def test_an_untraced_call_runs_in_no_trace(channel):
    assert channel.unary_unary("/t.T/Unary")(b"", timeout=5) == b"0" * 32
    assert list(channel.unary_stream("/t.T/Stream")(b"", timeout=5)) == [b"0" * 32] * 2
