"""Each service started with --metrics-port answers Prometheus scrapes at
http://127.0.0.1:PORT/metrics with the instruments its OpenTelemetry exporters
see, and the values follow real RPCs: RPC latency histograms per method, pool
pages per tier, orders by state and outcome, bytes replicated and wasted,
forecasts served. The same port answers the HTTP probes /healthz and /readyz
from the process's gRPC health service. The exposition is read with prometheus_client's parser, as
a scraper would. The dashboard's queries name only series the services serve.
"""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from speckv.v1 import (
    common_pb2,
    kvstore_pb2,
    kvstore_pb2_grpc,
    predictor_pb2,
    predictor_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from tests.support.grpc_helpers import running
from tests.support.repo import REPO_ROOT
from tests.support.waiting import TIMEOUT

RPC_COUNT = "speckv_rpc_server_duration_seconds_count"
HASHES = [101, 102, 103]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> list[Sample]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return [Sample(s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    """The one sample of name whose labels include labels."""
    (match,) = [s for s in samples if s.name == name and labels.items() <= s.labels.items()]
    return match.value


def total(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def refused(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT)
    except urllib.error.URLError:
        return True
    return False


def put_blocks(kv: kvstore_pb2_grpc.KVStoreStub, bytes_per_block: int) -> None:
    kv.PutBlocks(iter(kvstore_pb2.PutBlockRequest(block_hash=h, data=bytes(bytes_per_block)) for h in HASHES),
                 timeout=TIMEOUT)


@pytest.fixture(scope="module")
def kvstore_scrape() -> tuple[list[Sample], int, bool]:
    """A kvstore with both tiers after PutBlocks and Lookup: its scrape, the
    port, and whether the port was closed once the server stopped."""
    port = free_port()
    argv = ["--node-id", "node-m", "--device-pages", "64", "--host-pages", "32", "--metrics-port", str(port)]
    with running("kvstore", argv) as server, grpc.insecure_channel(server.address) as channel:
        kv = kvstore_pb2_grpc.KVStoreStub(channel)
        put_blocks(kv, kv.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).geometry.bytes_per_block)
        assert kv.Lookup(kvstore_pb2.LookupRequest(block_hashes=HASHES), timeout=TIMEOUT).prefix_blocks == len(HASHES)
        samples = scrape(port)
    return samples, port, refused(port)


@pytest.fixture(scope="module")
def scheduler_scrape() -> tuple[list[Sample], int]:
    """A scheduler (metrics on) routing to a real kvstore, with one replicate
    order committed and one cancelled: its scrape and a replica's bytes."""
    port = free_port()
    with running("kvstore", ["--node-id", "node-a"]) as kvstore, \
            running("scheduler", ["--engine-profile", "tiny", "--metrics-port", str(port)]) as scheduler, \
            grpc.insecure_channel(kvstore.address) as kv_channel, \
            grpc.insecure_channel(scheduler.address) as sched_channel:
        kv = kvstore_pb2_grpc.KVStoreStub(kv_channel)
        geometry = kv.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).geometry
        sched = scheduler_pb2_grpc.SchedulerStub(sched_channel)

        def register(node_id: str, address: str) -> None:
            sched.RegisterNode(scheduler_pb2.RegisterNodeRequest(
                node_id=node_id, address=address, capacity_pages=64, geometry=geometry), timeout=TIMEOUT)

        register("node-a", kvstore.address)
        put_blocks(kv, geometry.bytes_per_block)
        route = sched.Route(scheduler_pb2.RouteRequest(
            request_id="r1", block_hashes=HASHES, prompt_tokens=len(HASHES) * geometry.block_size + 1),
            timeout=TIMEOUT)
        assert (route.node_id, route.cached_blocks) == ("node-a", len(HASHES))
        # The replicas' target, registered after the route so that the route
        # has one candidate (nothing listens there; no order is executed).
        register("node-b", "127.0.0.1:1")
        replica_bytes = len(HASHES) * geometry.bytes_per_block

        def submit(hashes: list[int]) -> str:
            return sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
                block_hashes=hashes, source_node="node-a", target_node="node-b", lease_ms=60_000,
                family="fam", policy="manual")), timeout=TIMEOUT).order_id

        def report(order_id: str, state: int, sent: int = 0) -> None:
            sched.ReportOrderStatus(scheduler_pb2.OrderStatusReport(order_id=order_id, state=state,
                                                                    bytes_sent=sent), timeout=TIMEOUT)

        committed = submit(HASHES)
        report(committed, common_pb2.ORDER_STATE_IN_FLIGHT)
        report(committed, common_pb2.ORDER_STATE_COMMITTED, replica_bytes)
        report(submit([201, 202]), common_pb2.ORDER_STATE_CANCELLED)
        samples = scrape(port)
    return samples, replica_bytes


@pytest.fixture(scope="module")
def predictor_scrape() -> tuple[list[Sample], list[predictor_pb2.ForecastResponse]]:
    """A predictor after arrivals of one family and two Forecast calls: its
    scrape and the answers."""
    port = free_port()
    with running("predictor", ["--metrics-port", str(port)]) as server, \
            grpc.insecure_channel(server.address) as channel:
        stub = predictor_pb2_grpc.PredictorStub(channel)
        now = time.time()
        arrivals = [predictor_pb2.Arrival(time_s=now - 5.0 + 0.5 * i, family="hot", node_id="n1",
                                          prompt_tokens=100) for i in range(8)]
        assert stub.ObserveArrivals(iter(arrivals), timeout=TIMEOUT).accepted == len(arrivals)
        answers = [stub.Forecast(predictor_pb2.ForecastRequest(families=["hot", "never-seen"]), timeout=TIMEOUT),
                   stub.Forecast(predictor_pb2.ForecastRequest(families=["hot"]), timeout=TIMEOUT)]
        samples = scrape(port)
    return samples, answers


def test_kvstore_serves_rpc_latency_and_pool_pages_per_tier(kvstore_scrape):
    samples, _, _ = kvstore_scrape
    for method in ("PutBlocks", "Lookup"):
        assert value(samples, RPC_COUNT, rpc_method=f"/speckv.v1.KVStore/{method}", rpc_grpc_status_code="OK") == 1
        assert value(samples, "speckv_rpc_server_duration_seconds_bucket",
                     rpc_method=f"/speckv.v1.KVStore/{method}", le="+Inf") == 1
    assert total(samples, "speckv_rpc_server_calls_total", rpc_method="/speckv.v1.KVStore/PutBlocks") == 1
    device = {s: value(samples, "speckv_kvstore_pages", node="node-m", tier="device", state=s)
              for s in ("used", "free", "pinned", "replica")}
    assert device == {"used": len(HASHES), "free": 64 - len(HASHES), "pinned": 0, "replica": 0}
    host = {s: value(samples, "speckv_kvstore_pages", node="node-m", tier="host", state=s) for s in ("used", "free")}
    assert host == {"used": 0, "free": 32}
    assert value(samples, "speckv_kvstore_pool_occupancy", node="node-m", tier="device") == len(HASHES) / 64
    assert value(samples, "speckv_kvstore_blocks", node="node-m", kind="stored") == len(HASHES)


def test_the_endpoint_closes_with_the_server(kvstore_scrape):
    _, _, closed = kvstore_scrape
    assert closed


def test_scheduler_serves_orders_by_state_and_outcome_and_replicated_bytes(scheduler_scrape):
    samples, replica_bytes = scheduler_scrape
    for method, calls in (("RegisterNode", 2), ("Route", 1), ("SubmitOrder", 2)):
        assert value(samples, RPC_COUNT, rpc_method=f"/speckv.v1.Scheduler/{method}") == calls
    assert value(samples, "speckv_scheduler_live_nodes") == 2
    states = {s.labels["state"]: s.value for s in samples if s.name == "speckv_scheduler_orders"}
    assert states == {"issued": 0, "in_flight": 0, "committed": 1, "failed": 0, "cancelled": 1, "expired": 0}
    replicate = {"policy": "manual", "action": "replicate"}
    outcomes = {s.labels["outcome"]: s.value for s in samples
                if s.name == "speckv_scheduler_action_orders" and replicate.items() <= s.labels.items()}
    # The committed replica's lease (60 s) is still running: no outcome yet.
    assert outcomes == {"used_in_time": 0, "used_late": 0, "never_used": 0, "cancelled": 1, "failed": 0,
                        "pending": 1}
    assert value(samples, "speckv_scheduler_replica_bytes", kind="replicated") == replica_bytes
    assert value(samples, "speckv_scheduler_replica_bytes", kind="wasted") == 0
    # A replicate order's bytes count at issue: the cancelled order's are decided, the committed one's pending.
    assert value(samples, "speckv_scheduler_action_bytes", outcome="pending", **replicate) == replica_bytes
    assert value(samples, "speckv_scheduler_action_bytes", outcome="cancelled", **replicate) == \
        2 * replica_bytes // len(HASHES)


def test_predictor_counts_the_forecasts_it_serves(predictor_scrape):
    samples, answers = predictor_scrape
    rows = [row for answer in answers for row in answer.forecasts]
    assert value(samples, RPC_COUNT, rpc_method="/speckv.v1.Predictor/Forecast") == len(answers)
    for known in (True, False):
        served = value(samples, "speckv_predictor_forecasts_total", known=str(known).lower())
        assert served == sum(1 for row in rows if row.known == known) > 0
    assert value(samples, "speckv_predictor_families_tracked") >= 1
    assert value(samples, "speckv_predictor_families_dropped") == 0  # far under the cap


def test_the_dashboard_queries_only_served_series(kvstore_scrape, scheduler_scrape, predictor_scrape):
    served = {s.name for samples in (kvstore_scrape[0], scheduler_scrape[0], predictor_scrape[0]) for s in samples}
    dashboard = json.loads((REPO_ROOT / "deploy/grafana/speckv.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel.get("targets", ())
               for name in re.findall(r"\bspeckv_[a-z_]+", target["expr"])}
    assert queried, "the dashboard queries speckv series"
    assert queried <= served, f"queried but never served: {sorted(queried - served)}"


def http_get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET path, error statuses included."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=TIMEOUT) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_probe_paths_follow_the_health_service_into_shutdown():
    """/healthz answers while the process serves HTTP; /readyz says what the
    gRPC health service says about "" (the whole process): 200 SERVING once
    started, 503 NOT_SERVING from the start of stop() (the on_stop hooks run
    after health goes NOT_SERVING and before the endpoint closes), so a
    Kubernetes readiness probe takes a draining pod out of its Service."""
    port = free_port()
    during_stop: dict[str, tuple[int, str]] = {}
    with running("predictor", ["--metrics-port", str(port)]) as server, \
            grpc.insecure_channel(server.address) as channel:
        grpc_status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                timeout=TIMEOUT).status
        assert grpc_status == health_pb2.HealthCheckResponse.SERVING
        assert http_get(port, "/healthz") == (200, "OK\n")
        assert http_get(port, "/readyz") == (200, "SERVING\n")
        for path in ("/", "/health", "/readyz/", "/healthz/x", "/ready"):
            assert http_get(port, path)[0] == 404, path
        assert http_get(port, "/metrics")[0] == 200
        server.on_stop(lambda: during_stop.update(readyz=http_get(port, "/readyz"), healthz=http_get(port, "/healthz")))
    assert during_stop == {"readyz": (503, "NOT_SERVING\n"), "healthz": (200, "OK\n")}
    assert refused(port)
