"""Prometheus `/metrics` over HTTP, fed by a process's OpenTelemetry instruments.

The endpoint adds a PrometheusMetricReader to the process's MeterProvider, so
the instruments that reach OTLP or the console (telemetry.py) are the ones
scraped here, aggregated by the same SDK (cumulative; histograms with the
boundaries of telemetry.py's views). Each scrape runs the observable gauges'
callbacks once. Names follow the OpenTelemetry to Prometheus mapping: dots
become underscores, the unit becomes a suffix (`s` -> `_seconds`), counters end
in `_total`; attribute keys become labels (`rpc.method` -> `rpc_method`).

Every endpoint has its own CollectorRegistry, never the global one, so several
servers in one process (the service tests) each expose only their own
instruments.

Given a `readiness` callable (ServiceServer passes one reading its gRPC health
servicer), the endpoint also answers the kubelet's HTTP probes, which is what
lets Kubernetes probe a server whose gRPC port is mutual TLS (the kubelet's
native gRPC probe speaks no TLS and has no client certificate):

    GET /healthz   200 "OK" whenever the process answers HTTP at all (liveness)
    GET /readyz    200 "SERVING" while readiness() is "SERVING", else 503 with
                   the status it named (NOT_SERVING from the start of a drain on)

Every other path is a 404. The endpoint is plain HTTP on purpose: it carries
read-only counters and a serving status, no secrets and nothing that changes
state, and its clients (the kubelet's probes, an annotation-driven Prometheus
scrape) hold no certificate of the cluster's CA to present.
"""
from __future__ import annotations

import logging
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, make_wsgi_app

from speckv.services.common.errors import InvalidArgument

log = logging.getLogger(__name__)
METRICS_PATH = "/metrics"
HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
SERVING = "SERVING"  # the grpc.health.v1 status name readiness() returns for a ready process
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def bind_family(host: str) -> tuple[socket.AddressFamily, str]:
    """The socket family and bare address for host as the gRPC server takes it:
    an IPv6 literal may come bracketed (`[::]`, as in `[::]:50051`) and binds
    AF_INET6 without the brackets; anything else (IPv4, a name) binds AF_INET."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return (socket.AF_INET6 if ":" in bare else socket.AF_INET), bare


def only_metrics_path(app: WsgiApp) -> WsgiApp:
    """app for GET /metrics; 404 for any other path."""
    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"not found; metrics are at {METRICS_PATH}\n".encode()]
        return app(environ, start_response)

    return serve


def with_probe_paths(app: WsgiApp, readiness: Callable[[], str]) -> WsgiApp:
    """app (only_metrics_path's) plus GET /healthz and GET /readyz (module
    docstring). readiness() is called once per /readyz request, so the answer
    is the servicer's status at that moment, never a cached one."""
    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in (HEALTHZ_PATH, READYZ_PATH):
            return app(environ, start_response)
        if environ.get("REQUEST_METHOD", "GET") != "GET":  # the kubelet's probes GET
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain; charset=utf-8"),
                                                      ("Allow", "GET")])
            return [b"GET only\n"]
        status = "OK" if path == HEALTHZ_PATH else readiness()
        code = "200 OK" if path == HEALTHZ_PATH or status == SERVING else "503 Service Unavailable"
        start_response(code, [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")])
        return [f"{status}\n".encode()]

    return serve


class _QuietHandler(WSGIRequestHandler):
    # Scrapes arrive every few seconds; an access log line each would drown the service's log.
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    # A slow scraper must not hold up the next one, nor keep the process alive.
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class MetricsEndpoint:
    """An HTTP server answering GET /metrics with meter_provider's instruments,
    and with readiness given, GET /healthz and /readyz (module docstring).

    Binds at construction (a taken port fails here, as the gRPC port does),
    serves from `start()` on a daemon thread, and `stop()` closes the socket
    and detaches the reader from meter_provider; stop is idempotent. port 0
    picks a free port (`port` says which). Synchronous instruments (counters,
    histograms) reach it from its construction on: the SDK gives a reader its
    own aggregation from when it is added, so ServiceServer builds it before
    it serves a call. Observable gauges read the present at each scrape.
    """

    def __init__(self, meter_provider: MeterProvider, host: str, port: int,
                 readiness: Callable[[], str] | None = None) -> None:
        self._meter_provider = meter_provider
        registry = CollectorRegistry()
        # Scope labels would repeat the service name on every series; the
        # service is already the scrape job.
        self._reader = PrometheusMetricReader(scope_info_enabled=False, registry=registry)
        family, bare = bind_family(host)
        server_class = _ThreadingServer6 if family == socket.AF_INET6 else _ThreadingServer
        try:
            app = only_metrics_path(make_wsgi_app(registry))
            if readiness is not None:
                app = with_probe_paths(app, readiness)
            self._http = make_server(bare, port, app, server_class=server_class, handler_class=_QuietHandler)
        except OSError as exc:
            self._reader.shutdown()
            raise InvalidArgument(f"could not bind the metrics endpoint {host}:{port}: {exc}") from None
        meter_provider.add_metric_reader(self._reader)
        self.host = host
        self.port: int = self._http.server_address[1]
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def url(self) -> str:
        family, bare = bind_family(self.host)
        host = f"[{bare}]" if family == socket.AF_INET6 else bare
        return f"http://{host}:{self.port}{METRICS_PATH}"

    def start(self) -> "MetricsEndpoint":
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.2},
                                            name=f"metrics-{self.port}", daemon=True)
            self._thread.start()
            log.info("metrics on %s", self.url)
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._thread is not None:
            self._http.shutdown()
            self._thread.join()
        self._http.server_close()
        # remove_metric_reader also shuts the reader down, which unregisters
        # its collector from the registry.
        self._meter_provider.remove_metric_reader(self._reader)
