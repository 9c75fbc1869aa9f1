"""A production-shaped gRPC server: health checking, reflection, the error
interceptor, OpenTelemetry, message size limits, caps on streams and queued
calls, mutual TLS, and graceful shutdown.

TLS: with --tls-cert/--tls-key/--tls-ca the one port is mutual TLS (tls.py);
without, the host must be loopback unless --insecure says otherwise, and then
the start logs a loud warning (docs/security.md).

Threads: a streaming call holds a handler thread for as long as its client
keeps it open, so the pool has max_streams threads for streams plus
`workers` more that only unary calls (and refusals) ever wait for: streams
beyond max_streams (or max_streams_per_peer from one host) are answered
RESOURCE_EXHAUSTED at once (interceptor.py), so a unary call always finds a
thread. Calls beyond the threads wait in a queue of max_queued_calls; grpc
answers RESOURCE_EXHAUSTED beyond that. docs/limits.md lists every limit.

Shutdown order: health goes NOT_SERVING (load balancers stop sending), stop
hooks end long-lived streams, the server refuses new calls and in-flight calls
drain for up to grace_s, the metrics endpoint closes, then telemetry is
flushed.

With `metrics_port` set, the process also answers Prometheus scrapes at
http://host:metrics_port/metrics (metrics_http.py), on the gRPC server's host,
from the same instruments its OpenTelemetry exporters see, and the HTTP
probes /healthz and /readyz; /readyz reads the health servicer's status of ""
(the whole process), which is NOT_SERVING from construction until start()
has run its hooks, SERVING then, and NOT_SERVING again from the start of
stop(). Kubernetes probes those when the gRPC port is mutual TLS
(deploy/k8s/components/tls).
"""
from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from speckv.services.common.config import check_port, check_positive
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.rpc.interceptor import ErrorMappingInterceptor, StreamSlots
from speckv.services.common.rpc.metrics_http import MetricsEndpoint
from speckv.services.common.rpc.service_metrics import RpcMetrics
from speckv.services.common.rpc.telemetry import Telemetry
from speckv.services.common.rpc.tls import SERVICES, URI_PREFIX, Identity, Role, TlsFiles, TlsMaterial, is_loopback

log = logging.getLogger(__name__)
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Settings every service shares. Sizes in MiB, times in seconds."""

    host: str = field(default="127.0.0.1", metadata={"help": "address to bind"})
    port: int = field(default=0, metadata={"help": "port to bind; 0 picks a free one"})
    max_message_mb: int = field(default=64, metadata={"help": "largest gRPC message accepted or sent, MiB"})
    grace_s: float = field(default=5.0, metadata={"help": "how long in-flight calls may drain on shutdown"})
    workers: int = field(default=32, metadata={
        "help": "handler threads kept for unary calls, on top of the max_streams threads streams may hold"})
    max_streams: int = field(default=128, metadata={
        "help": "streaming calls served at once (server, client or bidirectional streams); more: RESOURCE_EXHAUSTED"})
    # 64: `speckv up` runs up to 64 nodes on one host, each with a stream open to the scheduler.
    max_streams_per_peer: int = field(default=64, metadata={
        "help": "streaming calls served at once from one peer host (capped at max_streams); more: RESOURCE_EXHAUSTED"})
    max_queued_calls: int = field(default=256, metadata={
        "help": "calls waiting for a handler thread at most; more: RESOURCE_EXHAUSTED"})
    metrics_port: int = field(default=0, metadata={
        "help": "port of the Prometheus /metrics HTTP endpoint, on host; 0: no endpoint"})
    # Mutual TLS (tls.py, docs/security.md): all three or none. The same files serve the
    # process's own outbound calls (a kvstore's to the scheduler, the scheduler's to kvstores).
    tls_cert: str = field(default="", metadata={"help": "this process's certificate (PEM); with tls_key and "
                                                        "tls_ca: mutual TLS on every call in and out"})
    tls_key: str = field(default="", metadata={"help": "the private key of tls_cert (PEM, unencrypted)"})
    tls_ca: str = field(default="", metadata={"help": "the CA certificate (PEM) that signed every peer's"})
    insecure: bool = field(default=False, metadata={
        "help": "allow a non-loopback host without TLS (anyone who reaches the port can do anything)"})

    def validate(self) -> None:
        check_port("port", self.port)
        check_port("metrics_port", self.metrics_port)
        if self.metrics_port and self.metrics_port == self.port:
            raise InvalidArgument(f"metrics_port={self.metrics_port}: must differ from port")
        check_positive("grace_s", self.grace_s)
        if not 1 <= self.max_message_mb <= 1024:
            raise InvalidArgument(f"max_message_mb={self.max_message_mb}: must be 1..1024")
        if self.workers < 4:
            raise InvalidArgument(f"workers={self.workers}: need at least 4 threads for unary calls")
        for name in ("max_streams", "max_streams_per_peer", "max_queued_calls"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name}={getattr(self, name)}: must be >= 1")
        if self.tls_files() is not None:
            self.tls()  # the files are read and checked now, so a bad one fails the start naming it
        else:
            self.check_plaintext_host()

    def check_plaintext_host(self) -> None:
        """Without TLS only loopback, unless --insecure was chosen."""
        if not is_loopback(self.host) and not self.insecure:
            raise InvalidArgument(f"host={self.host!r}: without TLS a service binds loopback only; give "
                                  "--tls-cert/--tls-key/--tls-ca (docs/security.md), or --insecure to serve "
                                  "plaintext to anyone who reaches the port")

    def tls_files(self) -> TlsFiles | None:
        return TlsFiles.from_settings(self.tls_cert, self.tls_key, self.tls_ca)

    def tls(self) -> TlsMaterial | None:
        """The loaded TLS files (None: TLS off); InvalidArgument names a bad file."""
        files = self.tls_files()
        return files.load() if files is not None else None

    @property
    def handler_threads(self) -> int:
        """The pool: a thread per admitted stream plus the unary headroom."""
        return self.max_streams + self.workers

    @property
    def max_concurrent_rpcs(self) -> int:
        """Calls grpc accepts at once: one per thread plus the queue."""
        return self.handler_threads + self.max_queued_calls

    @property
    def max_message_bytes(self) -> int:
        return self.max_message_mb * MIB


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        # BDP probing shrinks windows on loopback bulk streams, about halving
        # their throughput (docs/performance.md, "gRPC streaming").
        ("grpc.http2.bdp_probe", 0),
    ]


def open_channel(address: str, telemetry: Telemetry | None, max_message_bytes: int = 64 * MIB,
                 tls: TlsMaterial | None = None, peer_role: str = "") -> grpc.Channel:
    """An instrumented channel (trace context propagates through it):
    mutual TLS presenting tls's certificate, the server proving peer_role
    (tls.ROLES; "": its address), or plaintext when tls is None."""
    options = channel_options(max_message_bytes)
    channel = (tls.secure_channel(address, options, peer_role) if tls is not None
               else grpc.insecure_channel(address, options=options))
    return telemetry.instrument_channel(channel) if telemetry is not None else channel


class ServiceServer:
    """One gRPC server process-part. `register(server)` adds the servicers and
    returns the full names of the services it added (for health/reflection)."""

    def __init__(
        self,
        name: str,
        settings: ServerSettings,
        telemetry: Telemetry,
        register: Callable[[grpc.Server], Sequence[str]],
    ) -> None:
        self.name = name
        self.settings = settings
        self.telemetry = telemetry
        self._start_hooks: list[Callable[[], None]] = []
        self._stop_hooks: list[Callable[[], None]] = []
        self._stopped = threading.Event()
        self.stream_slots = StreamSlots(settings.max_streams, settings.max_streams_per_peer)
        mapping = ErrorMappingInterceptor(RpcMetrics(telemetry.meter_provider, name), self.stream_slots)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=settings.handler_threads, thread_name_prefix=name),
            interceptors=[telemetry.server_interceptor(), mapping],
            options=[*channel_options(settings.max_message_bytes), ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
        )
        self.service_names = list(register(self._server))
        self._health = health.HealthServicer(experimental_non_blocking=True)
        # The servicer starts with "" SERVING; the process is not until start() has run its
        # hooks, and /readyz (served from before the hooks run) must not say otherwise.
        self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self._server)
        self.tls = settings.tls()
        _check_identity(name, self.tls)
        bind = f"{settings.host}:{settings.port}"
        # One port, TLS or plaintext, never both: authz.py relies on it.
        if self.tls is not None:
            self.port = self._server.add_secure_port(bind, self.tls.server_credentials())
        else:
            settings.check_plaintext_host()  # again: a config built without validate() must not slip past
            if not is_loopback(settings.host):
                log.warning("!!! %s serves PLAINTEXT gRPC on %s (--insecure): no TLS, no identities; anyone who "
                            "reaches this port may register nodes, set the policy and read or write KV blocks. "
                            "Use --tls-cert/--tls-key/--tls-ca (docs/security.md). !!!", name, bind)
            self.port = self._server.add_insecure_port(bind)
        if self.port == 0:
            raise InvalidArgument(f"could not bind {settings.host}:{settings.port}")
        # Bound now, like the gRPC port, so a taken port fails before serving. Plain HTTP even
        # when the gRPC port is mutual TLS: it serves read-only counters and the serving status,
        # no secrets and nothing that changes state, to clients (the kubelet's probes, Prometheus)
        # that hold no certificate of the cluster's CA.
        self.metrics = MetricsEndpoint(telemetry.meter_provider, settings.host, settings.metrics_port,
                                       readiness=self.health_status) if settings.metrics_port else None

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    def health_status(self, service: str = "") -> str:
        """The status name (SERVING, NOT_SERVING, SERVICE_UNKNOWN) the standard
        health service answers for service ("": the whole process) right now,
        read through the servicer's own Check, so /readyz and a gRPC health
        probe never disagree."""
        context = _LocalCheck()
        reply = self._health.Check(health_pb2.HealthCheckRequest(service=service), context)
        if context.code is grpc.StatusCode.NOT_FOUND:
            return health_pb2.HealthCheckResponse.ServingStatus.Name(health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def on_start(self, hook: Callable[[], None]) -> None:
        """hook runs once the server accepts calls (start background threads)."""
        self._start_hooks.append(hook)

    def on_stop(self, hook: Callable[[], None]) -> None:
        """hook runs at shutdown, before draining (end streams, stop threads)."""
        self._stop_hooks.append(hook)

    def start(self) -> "ServiceServer":
        self._server.start()
        if self.metrics is not None:
            self.metrics.start()
        for hook in self._start_hooks:
            hook()
        for service in ("", *self.service_names):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("%s serving on %s", self.name, self.address)
        return self

    def stop(self, grace_s: float | None = None) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._health.enter_graceful_shutdown()
        for hook in self._stop_hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - one bad hook must not block shutdown
                log.exception("stop hook failed in %s", self.name)
        self._server.stop(self.settings.grace_s if grace_s is None else grace_s).wait()
        if self.metrics is not None:
            self.metrics.stop()
        self.telemetry.shutdown()
        log.info("%s stopped", self.name)

    def wait(self) -> None:
        self._stopped.wait()


class _LocalCheck:
    """The one part of a ServicerContext HealthServicer.Check uses (set_code,
    for a service it does not know), for asking it in-process."""

    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code


def _check_identity(name: str, tls: TlsMaterial | None) -> None:
    """A service's certificate must name it: clients verify the role's DNS name
    (tls.py), so a wrong one would fail every handshake later, less clearly."""
    if tls is None or name not in ("kvstore", *SERVICES):
        return
    role_ok = tls.identity.role is Role.NODE if name == "kvstore" else tls.identity == Identity.service(name)
    if not role_ok:
        raise InvalidArgument(f"tls_cert: names {tls.identity}, not a {name} identity "
                              f"({URI_PREFIX}{'node/<id>' if name == 'kvstore' else 'service/' + name})")


def serve_until_signal(server: ServiceServer) -> int:
    """Runs server until SIGTERM or SIGINT, then shuts it down gracefully."""
    done = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("%s: signal %d, shutting down", server.name, signum)
        done.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    server.start()
    print(f"{server.name} listening on {server.address}", flush=True)
    while not done.wait(0.5):
        pass
    server.stop()
    return 0
