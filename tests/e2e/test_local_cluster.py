"""`speckv up` starts a healthy cluster that stock gRPC clients can probe,
`speckv status` reads it, and SIGTERM leaves no process behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.grpc_helpers import SERVICE_NAMES, reflected_services
from tests.support.speckv_up import SPECKV, start_up


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def cluster(tmp_path):
    env = {**os.environ, "SPECKV_RUN_DIR": str(tmp_path)}
    process, output = start_up(["--nodes", "2"], env)
    state = json.loads((tmp_path / "cluster.json").read_text())
    yield process, state, env, output
    if process.poll() is None:
        process.kill()
        process.wait()


def test_up_status_and_clean_stop(cluster):
    process, state, env, output = cluster
    services = state["services"]
    assert sorted(s["kind"] for s in services) == ["kvstore", "kvstore", "predictor", "scheduler"]
    for s in services:
        assert s["address"] in output  # the printed table names every service
        with grpc.insecure_channel(s["address"]) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert SERVICE_NAMES[s["kind"]] in reflected_services(s["address"])

    status = subprocess.run([*SPECKV, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "node-0" in status.stdout and "node-1" in status.stdout and "DOWN" not in status.stdout

    probe = subprocess.run([*SPECKV, "health", "--address", state["scheduler"]], env=env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0 and "SERVING" in probe.stdout

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    pids = [s["pid"] for s in services]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "a service outlived speckv up"

    after = subprocess.run([*SPECKV, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert after.returncode == 2 and "no local cluster" in after.stderr
