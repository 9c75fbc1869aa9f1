"""Service metrics through the OpenTelemetry metrics API.

Instruments are created against an injected MeterProvider, so tests can read
them with an in-memory reader and services export them the way OTEL_* says.
"""
from __future__ import annotations

from typing import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation


class RpcMetrics:
    """Server RPC counts and latencies, by method and status code."""

    def __init__(self, meter_provider: MeterProvider, service: str) -> None:
        meter = meter_provider.get_meter(f"speckv.{service}")
        self._calls = meter.create_counter(
            "speckv.rpc.server.calls", unit="{call}", description="RPCs handled, by method and status")
        self._duration = meter.create_histogram(
            "speckv.rpc.server.duration", unit="s", description="RPC handling time, by method")

    def record(self, method: str, status: str, seconds: float) -> None:
        attributes = {"rpc.method": method, "rpc.grpc.status_code": status}
        self._calls.add(1, attributes)
        self._duration.record(seconds, attributes)


def register_gauges(
    meter_provider: MeterProvider,
    service: str,
    gauges: dict[str, Callable[[], Iterable[tuple[float, dict[str, str]]]]],
) -> None:
    """Registers observable gauges; each callback yields (value, attributes)."""
    meter = meter_provider.get_meter(f"speckv.{service}")
    for name, read in gauges.items():
        def callback(options: CallbackOptions, read=read) -> list[Observation]:
            return [Observation(value, attributes) for value, attributes in read()]

        meter.create_observable_gauge(name, callbacks=[callback])
