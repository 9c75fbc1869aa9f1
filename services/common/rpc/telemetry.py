"""OpenTelemetry set-up for one service process.

Exporters follow the standard variables, read from the environ mapping given
(never at import time): OTEL_TRACES_EXPORTER and OTEL_METRICS_EXPORTER each
take `none` (the default here), `console` or `otlp`; the OTLP exporter reads
OTEL_EXPORTER_OTLP_* itself. Health-check RPCs are not traced: probes would
drown the traces that matter.

Every reader of a process (OTLP, console, the Prometheus endpoint of
metrics_http.py, a test's in-memory one) sees the same instruments through one
MeterProvider and the same views: the RPC latency histogram has buckets in
seconds sized for RPC latencies (the SDK's default boundaries, 0..10000, suit
milliseconds and would put every RPC in its first bucket).

A process whose traces go nowhere (no span processor: OTEL_TRACES_EXPORTER
none, the default, and none passed in) records no server spans: building one
cost a scheduler Route about 100 us of its ~600 us of server CPU, for a span
no exporter would ever see. It still takes the caller's trace context from
the call's metadata and makes it current while the call runs, so the calls
it makes downstream (through instrument_channel) carry the caller's trace on
to the services that do export.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

import grpc
from opentelemetry.instrumentation.grpc import client_interceptor, server_interceptor
from opentelemetry.instrumentation.grpc.filters import health_check, negate
from opentelemetry.context import attach, detach
from opentelemetry.instrumentation.grpc.grpcext import intercept_channel
from opentelemetry.propagate import extract
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from speckv.services.common.errors import InvalidArgument

log = logging.getLogger(__name__)
EXPORTER_CHOICES = ("none", "console", "otlp")
RPC_DURATION = "speckv.rpc.server.duration"  # service_metrics.RpcMetrics' histogram
# Upper bounds, seconds: from a loopback lookup to a long bulk PutBlocks
# stream; longer calls (event streams held open) land in +Inf.
RPC_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(slots=True)
class Telemetry:
    """Providers and gRPC interceptors of one process (or one test)."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    traces_exported: bool = True  # False: no span processor, so no server spans (module docstring)

    def server_interceptor(self) -> grpc.ServerInterceptor:
        if not self.traces_exported:
            return ContextOnlyInterceptor()
        return server_interceptor(tracer_provider=self.tracer_provider, filter_=negate(health_check()))

    def instrument_channel(self, channel: grpc.Channel) -> grpc.Channel:
        # OpenTelemetry's client interceptor speaks its own grpcext interface,
        # not grpc.intercept_channel's. Streaming calls through it return plain
        # iterators (no .cancel()): close the channel to cancel them.
        interceptor = client_interceptor(tracer_provider=self.tracer_provider, filter_=negate(health_check()))
        return intercept_channel(channel, interceptor)

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def build_telemetry(
    service_name: str,
    environ: Mapping[str, str],
    span_processors: tuple[SpanProcessor, ...] = (),
    metric_readers: tuple[MetricReader, ...] = (),
) -> Telemetry:
    """Providers for service_name with exporters chosen by environ, plus any
    extra processors/readers (tests pass in-memory ones)."""
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", service_name)})
    tracer_provider = TracerProvider(resource=resource)
    processors = (*_span_processors(environ), *span_processors)
    for processor in processors:
        tracer_provider.add_span_processor(processor)
    readers = (*_metric_readers(environ), *metric_readers)
    meter_provider = MeterProvider(resource=resource, metric_readers=list(readers), views=metric_views())
    return Telemetry(tracer_provider, meter_provider, traces_exported=bool(processors))


class ContextOnlyInterceptor(grpc.ServerInterceptor):
    """The server side of a process that exports no traces: each unary or
    streaming call runs with the caller's trace context (W3C traceparent in
    its metadata) current, and records no span."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary:
            return handler._replace(unary_unary=_in_caller_context(handler.unary_unary))
        if handler.stream_unary:
            return handler._replace(stream_unary=_in_caller_context(handler.stream_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=_streaming_in_caller_context(handler.unary_stream))
        return handler._replace(stream_stream=_streaming_in_caller_context(handler.stream_stream))


def _caller_context_token(context: grpc.ServicerContext) -> object | None:
    metadata = context.invocation_metadata()
    if not metadata or not any(md.key == "traceparent" for md in metadata):
        return None  # an untraced caller: nothing to carry on
    return attach(extract({md.key: md.value for md in metadata}))


def _in_caller_context(behavior):
    def wrapped(request_or_iterator, context):
        token = _caller_context_token(context)
        try:
            return behavior(request_or_iterator, context)
        finally:
            if token is not None:
                detach(token)

    return wrapped


def _streaming_in_caller_context(behavior):
    def wrapped(request_or_iterator, context):
        token = _caller_context_token(context)
        try:
            yield from behavior(request_or_iterator, context)
        finally:
            if token is not None:
                detach(token)

    return wrapped


def metric_views() -> list[View]:
    """Views every reader shares; instruments no view names keep the SDK's defaults."""
    return [View(instrument_name=RPC_DURATION,
                 aggregation=ExplicitBucketHistogramAggregation(RPC_SECONDS_BUCKETS))]


def _choice(environ: Mapping[str, str], variable: str) -> str:
    value = environ.get(variable, "none").strip().lower() or "none"
    if value not in EXPORTER_CHOICES:
        raise InvalidArgument(f"{variable}={value!r}: expected one of {', '.join(EXPORTER_CHOICES)}")
    return value


def _span_processors(environ: Mapping[str, str]) -> list[SpanProcessor]:
    choice = _choice(environ, "OTEL_TRACES_EXPORTER")
    if choice == "console":
        return [BatchSpanProcessor(ConsoleSpanExporter())]
    if choice == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return [BatchSpanProcessor(OTLPSpanExporter())]
    return []


def _metric_readers(environ: Mapping[str, str]) -> list[MetricReader]:
    choice = _choice(environ, "OTEL_METRICS_EXPORTER")
    if choice == "console":
        return [PeriodicExportingMetricReader(ConsoleMetricExporter())]
    if choice == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return [PeriodicExportingMetricReader(OTLPMetricExporter())]
    return []
