"""The Prometheus endpoint over a MeterProvider: where it binds, what it
answers, and that stopping it closes the port and detaches its reader."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.rpc.metrics_http import MetricsEndpoint, bind_family, only_metrics_path
from speckv.services.common.rpc.server import ServerSettings
from speckv.services.common.rpc.telemetry import RPC_DURATION, RPC_SECONDS_BUCKETS, build_telemetry


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1", (socket.AF_INET, "127.0.0.1")),
    ("0.0.0.0", (socket.AF_INET, "0.0.0.0")),
    ("localhost", (socket.AF_INET, "localhost")),
    ("[::]", (socket.AF_INET6, "::")),
    ("[::1]", (socket.AF_INET6, "::1")),
    ("::1", (socket.AF_INET6, "::1")),
])
def test_bind_family_takes_the_hosts_the_grpc_server_takes(host, expected):
    assert bind_family(host) == expected


def _call(app, path: str) -> tuple[str, bytes]:
    status = []
    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": "GET"}, lambda s, headers: status.append(s)))
    return status[0], body


def test_only_the_metrics_path_reaches_the_app():
    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"metrics"]

    assert _call(only_metrics_path(app), "/metrics") == ("200 OK", b"metrics")
    for path in ("/", "/metrics/", "/favicon.ico"):
        assert _call(only_metrics_path(app), path)[0] == "404 Not Found"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def test_an_endpoint_serves_its_providers_instruments_until_stopped():
    provider = MeterProvider()
    counter = provider.get_meter("speckv.test").create_counter("speckv.test.things", unit="{thing}")
    endpoint = MetricsEndpoint(provider, "127.0.0.1", 0).start()
    try:
        counter.add(3, {"kind": "a"})
        assert endpoint.url == f"http://127.0.0.1:{endpoint.port}/metrics"
        assert 'speckv_test_things_total{kind="a"} 3.0' in _get(endpoint.url)
        counter.add(2, {"kind": "a"})
        assert 'speckv_test_things_total{kind="a"} 5.0' in _get(endpoint.url)
        with pytest.raises(urllib.error.HTTPError) as missing:
            _get(f"http://127.0.0.1:{endpoint.port}/")
        assert missing.value.code == 404
    finally:
        endpoint.stop()
    endpoint.stop()  # idempotent
    with pytest.raises(urllib.error.URLError):
        _get(endpoint.url)
    provider.shutdown()


def test_two_endpoints_in_one_process_keep_their_own_instruments():
    first, second = MeterProvider(), MeterProvider()
    endpoints = [MetricsEndpoint(p, "127.0.0.1", 0).start() for p in (first, second)]
    first.get_meter("a").create_counter("speckv.first").add(1)
    second.get_meter("b").create_counter("speckv.second").add(1)
    try:
        texts = [_get(e.url) for e in endpoints]
    finally:
        for endpoint in endpoints:
            endpoint.stop()
    assert "speckv_first_total" in texts[0] and "speckv_second" not in texts[0]
    assert "speckv_second_total" in texts[1] and "speckv_first" not in texts[1]


def test_a_taken_port_fails_at_construction():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(InvalidArgument, match="metrics endpoint"):
            MetricsEndpoint(MeterProvider(), "127.0.0.1", taken.getsockname()[1])


def test_rpc_latencies_get_second_sized_buckets_in_every_reader():
    reader = InMemoryMetricReader()
    telemetry = build_telemetry("t", {}, metric_readers=(reader,))
    telemetry.meter_provider.get_meter("speckv.t").create_histogram(RPC_DURATION, unit="s").record(0.003)
    (point,) = [p for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics for p in m.data.data_points]
    assert tuple(point.explicit_bounds) == RPC_SECONDS_BUCKETS
    assert point.bucket_counts[RPC_SECONDS_BUCKETS.index(0.005)] == 1
    telemetry.shutdown()


def test_metrics_port_is_a_setting_off_by_default():
    assert parse_config(ServerSettings, [], {}, prog="t").metrics_port == 0
    assert parse_config(ServerSettings, [], {"SPECKV_METRICS_PORT": "9464"}, prog="t").metrics_port == 9464
    assert parse_config(ServerSettings, ["--metrics-port", "9465"], {"SPECKV_METRICS_PORT": "9464"},
                        prog="t").metrics_port == 9465
    with pytest.raises(InvalidArgument, match="metrics_port"):
        parse_config(ServerSettings, ["--metrics-port", "70000"], {}, prog="t")
    with pytest.raises(InvalidArgument, match="must differ from port"):
        parse_config(ServerSettings, ["--port", "9000", "--metrics-port", "9000"], {}, prog="t")
