"""One Route call yields one trace with spans in the scheduler and in the
kvstore it consults; RPC metrics are recorded (SDK in-memory exporters)."""
from __future__ import annotations

import time

import grpc
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tests.support.grpc_helpers import running


def _telemetry(service: str):
    spans, metrics = InMemorySpanExporter(), InMemoryMetricReader()
    return build_telemetry(service, {}, (SimpleSpanProcessor(spans),), (metrics,)), spans, metrics


def _spans_named(exporter: InMemorySpanExporter, name: str, kind: SpanKind):
    return [s for s in exporter.get_finished_spans() if s.name == name and s.kind == kind]


def _wait_for(predicate, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while not (result := predicate()):
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)
    return result


def test_route_is_one_trace_across_scheduler_and_kvstore():
    kv_telemetry, kv_spans, _ = _telemetry("kvstore")
    sched_telemetry, sched_spans, sched_metrics = _telemetry("scheduler")
    with running("kvstore", ["--node-id", "node-a"], kv_telemetry) as kvstore, \
            running("scheduler", [], sched_telemetry) as scheduler, \
            grpc.insecure_channel(kvstore.address) as kv_channel, \
            grpc.insecure_channel(scheduler.address) as sched_channel:
        kv = kvstore_pb2_grpc.KVStoreStub(kv_channel)
        geometry = kv.GetStats(kvstore_pb2.StatsRequest(), timeout=5).geometry
        sched = scheduler_pb2_grpc.SchedulerStub(sched_channel)
        sched.RegisterNode(scheduler_pb2.RegisterNodeRequest(
            node_id="node-a", address=kvstore.address, capacity_pages=64, geometry=geometry), timeout=5)
        hashes = [11, 12, 13]
        kv.PutBlocks(iter(kvstore_pb2.PutBlockRequest(block_hash=h, data=bytes(geometry.bytes_per_block))
                          for h in hashes), timeout=5)
        route = sched.Route(scheduler_pb2.RouteRequest(
            request_id="r1", block_hashes=hashes, prompt_tokens=len(hashes) * geometry.block_size + 1),
            timeout=5)
        assert route.node_id == "node-a"
        assert route.cached_blocks == len(hashes)

        (route_span,) = _wait_for(lambda: _spans_named(sched_spans, "/speckv.v1.Scheduler/Route", SpanKind.SERVER))
        trace_id = route_span.context.trace_id
        client_lookups = [s for s in _spans_named(sched_spans, "/speckv.v1.KVStore/Lookup", SpanKind.CLIENT)
                          if s.context.trace_id == trace_id]
        assert client_lookups, "the scheduler consulted the kvstore inside the Route trace"
        server_lookups = _wait_for(lambda: [
            s for s in _spans_named(kv_spans, "/speckv.v1.KVStore/Lookup", SpanKind.SERVER)
            if s.context.trace_id == trace_id])
        assert server_lookups[0].parent.span_id == client_lookups[0].context.span_id

    calls = {
        point.attributes["rpc.method"]
        for metric in _metric_points(sched_metrics, "speckv.rpc.server.calls")
        for point in [metric]
    }
    assert "/speckv.v1.Scheduler/Route" in calls


def _metric_points(reader: InMemoryMetricReader, name: str):
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data else ():
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    yield from metric.data.data_points
