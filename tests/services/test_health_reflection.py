"""Every service answers the standard health protocol and lists its speckv.v1
methods to a stock reflection client; SIGTERM drains and exits cleanly."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc, predictor_pb2, scheduler_pb2
from tests.support.grpc_helpers import SERVICE_NAMES, reflected_services, running


@pytest.mark.parametrize("service", sorted(SERVICE_NAMES))
def test_health_is_serving_for_server_and_service(service):
    with running(service) as server, grpc.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE_NAMES[service]):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as error:
            stub.Check(health_pb2.HealthCheckRequest(service="speckv.v1.Nope"), timeout=5)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("service", sorted(SERVICE_NAMES))
def test_reflection_lists_speckv_methods(service):
    with running(service) as server:
        services = reflected_services(server.address)
    assert "grpc.health.v1.Health" in services
    full_name = SERVICE_NAMES[service]
    module = {"kvstore": kvstore_pb2, "predictor": predictor_pb2, "scheduler": scheduler_pb2}[service]
    declared = module.DESCRIPTOR.services_by_name[full_name.rsplit(".", 1)[1]].methods_by_name
    assert set(services[full_name]) == set(declared)


def _start(service: str, *args: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-m", "speckv.services.cli", service, "--port", "0", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        if match:
            return process, match.group(1)
        if not line and process.poll() is not None:
            break
    process.kill()
    raise AssertionError(f"{service} did not start")


@pytest.mark.parametrize("service", sorted(SERVICE_NAMES))
def test_sigterm_exits_cleanly(service):
    process, _ = _start(service)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


def test_sigterm_ends_open_streams_and_exits():
    process, address = _start("kvstore")
    with grpc.insecure_channel(address) as channel:
        events = kvstore_pb2_grpc.KVStoreStub(channel).SubscribeEvents(
            kvstore_pb2.SubscribeEventsRequest(after_sequence=0), timeout=60)
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        # The open stream ends by itself (OK or CANCELLED), well before its deadline.
        try:
            for _ in events:
                pass
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), exc
    assert process.wait(timeout=60) == 0
