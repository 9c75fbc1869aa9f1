"""`speckv node add` and `speckv node remove NODE` against a real `speckv
up` (issue 27): an added node registers with the running scheduler (with
--tls, on a certificate from the cluster's CA); a removed one stops and the
scheduler stops counting it alive; a node that does not run is an error."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import grpc
import pytest

from speckv.services.common.rpc.tls import TlsFiles, dial
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.support.speckv_up import SPECKV, start_up


def _up(tmp_path, *flags: str) -> tuple[subprocess.Popen, dict, dict]:
    env = {**os.environ, "SPECKV_RUN_DIR": str(tmp_path), "SPECKV_LOG_LEVEL": "WARNING"}
    process, _ = start_up(["--nodes", "1", *flags], env)
    return process, json.loads((tmp_path / "cluster.json").read_text()), env


def _alive(state: dict) -> set[str]:
    tls = TlsFiles(**state["admin_tls"]).load() if "admin_tls" in state else None
    with dial(state["scheduler"], tls, "scheduler") as channel:
        reply = scheduler_pb2_grpc.SchedulerStub(channel).GetClusterState(scheduler_pb2.ClusterStateRequest(),
                                                                          timeout=10)
    return {n.node_id for n in reply.nodes if n.alive}


def _node(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECKV, "node", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flags", [pytest.param((), id="plaintext"), pytest.param(("--tls",), id="tls")])
def test_node_add_and_remove_against_a_running_cluster(tmp_path, flags):
    process, state, env = _up(tmp_path, *flags)
    try:
        assert _alive(state) == {"node-0"}
        added = _node(env, "add")
        assert added.returncode == 0, added.stderr
        assert added.stdout.startswith("node-1 added")
        assert _alive(state) == {"node-0", "node-1"}  # registered with the running scheduler

        removed = _node(env, "remove", "node-0")
        assert removed.returncode == 0, removed.stderr
        assert _alive(state) == {"node-1"}
        names = {s["name"] for s in json.loads((tmp_path / "cluster.json").read_text())["services"]}
        assert names == {"predictor", "scheduler", "node-1"}

        missing = _node(env, "remove", "node-0")
        assert missing.returncode == 2 and "no running node 'node-0'" in missing.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert not (tmp_path / "control.sock").exists()
    with pytest.raises(grpc.RpcError):
        _alive(state)  # everything stopped, the added node too
