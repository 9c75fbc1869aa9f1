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
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

import grpc
from opentelemetry.instrumentation.grpc import client_interceptor, server_interceptor
from opentelemetry.instrumentation.grpc.filters import health_check, negate
from opentelemetry.instrumentation.grpc.grpcext import intercept_channel
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

    def server_interceptor(self) -> grpc.ServerInterceptor:
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
    for processor in (*_span_processors(environ), *span_processors):
        tracer_provider.add_span_processor(processor)
    readers = (*_metric_readers(environ), *metric_readers)
    meter_provider = MeterProvider(resource=resource, metric_readers=list(readers), views=metric_views())
    return Telemetry(tracer_provider, meter_provider)


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
