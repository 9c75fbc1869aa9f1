"""`speckv up --tls`: a cluster whose every call is mutual TLS. Nodes
register with their own certificates, `speckv status` finds the admin's
files through cluster.json, a probe without a certificate is refused, and
SIGTERM still stops everything."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.support.speckv_up import SPECKV, start_up


@pytest.fixture
def tls_cluster(tmp_path):
    env = {**os.environ, "SPECKV_RUN_DIR": str(tmp_path)}
    process, output = start_up(["--nodes", "2", "--tls"], env)
    yield process, json.loads((tmp_path / "cluster.json").read_text()), env, output
    if process.poll() is None:
        process.kill()
        process.wait()


def test_up_with_tls(tls_cluster):
    process, state, env, output = tls_cluster
    admin = state["admin_tls"]
    assert "mutual TLS; admin identity" in output and admin["cert"] in output

    status = subprocess.run([*SPECKV, "status", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    nodes = json.loads(status.stdout)["nodes"]
    assert sorted(n["nodeId"] for n in nodes if n.get("alive")) == ["node-0", "node-1"]

    plain = subprocess.run([*SPECKV, "health", "--address", state["scheduler"], "--timeout-s", "5"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr
    tls_env = {**env, "SPECKV_TLS_CERT": admin["cert"], "SPECKV_TLS_KEY": admin["key"], "SPECKV_TLS_CA": admin["ca"]}
    probe = subprocess.run([*SPECKV, "health", "--address", state["scheduler"]], env=tls_env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0 and "SERVING" in probe.stdout

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
