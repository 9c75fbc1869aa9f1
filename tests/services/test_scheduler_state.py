"""A scheduler restarted on the same --state-dir resumes its policy, nodes and
orders: a real scheduler on loopback stopped and started again in process,
and a scheduler process killed with SIGKILL and started again."""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from speckv.services.common.errors import FailedPrecondition
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.server import build_server
from speckv.services.scheduler.adapters.state_store import DB_FILE
from speckv.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.support.scheduler_service import register, scheduler
from tests.support.waiting import TIMEOUT

S = common_pb2
PROCESS_TIMEOUT = 60.0  # a deadline for a subprocess to serve, not an expectation: generous, as machines are shared


def submit(stub, source: str, target: str, lease_ms: int = 600_000) -> str:
    order = S.ReplicationOrder(family="f", block_hashes=[1, 2, 3], source_node=source, target_node=target,
                               lease_ms=lease_ms)
    return stub.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order), timeout=TIMEOUT).order_id


def report(stub, order_id: str, state: int) -> int:
    return stub.ReportOrderStatus(scheduler_pb2.OrderStatusReport(order_id=order_id, state=state),
                                  timeout=TIMEOUT).state


def heartbeat(stub, node_id: str) -> bool:
    return stub.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id=node_id, free_pages=10), timeout=TIMEOUT).known


def counts(stub) -> dict[int, int]:
    state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    return {c.state: c.count for c in state.orders if c.count}


def alive(stub) -> dict[str, bool]:
    state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    return {n.node_id: n.alive for n in state.nodes}


def first_watched(stub, node_id: str) -> str:
    stream = stub.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id=node_id), timeout=TIMEOUT)
    try:
        return next(stream).order_id
    finally:
        stream.cancel()


def test_a_restart_resumes_policy_nodes_and_orders(tmp_path):
    state_dir = str(tmp_path / "state")
    with scheduler(state_dir=state_dir) as (_, stub):
        for n in ("n1", "n2", "n3"):
            register(stub, n, f"127.0.0.1:{n[1]}")
        stub.SetPolicy(scheduler_pb2.SetPolicyRequest(name="reactive-heat"), timeout=TIMEOUT)
        issued, moving, committed, failed = (submit(stub, "n1", "n2"), submit(stub, "n2", "n3"),
                                             submit(stub, "n1", "n3"), submit(stub, "n3", "n1"))
        assert report(stub, moving, S.ORDER_STATE_IN_FLIGHT) == S.ORDER_STATE_IN_FLIGHT
        assert report(stub, committed, S.ORDER_STATE_COMMITTED) == S.ORDER_STATE_COMMITTED
        assert report(stub, failed, S.ORDER_STATE_FAILED) == S.ORDER_STATE_FAILED
        before = counts(stub)

    with scheduler(state_dir=state_dir) as (_, stub):
        assert stub.GetPolicy(scheduler_pb2.GetPolicyRequest(), timeout=TIMEOUT).name == "reactive-heat"
        assert alive(stub) == {"n1": False, "n2": False, "n3": False}  # known, alive at the next heartbeat
        assert counts(stub) == before == {S.ORDER_STATE_ISSUED: 1, S.ORDER_STATE_IN_FLIGHT: 1,
                                          S.ORDER_STATE_COMMITTED: 1, S.ORDER_STATE_FAILED: 1}
        with pytest.raises(grpc.RpcError) as down:
            submit(stub, "n1", "n2")
        assert down.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert all(heartbeat(stub, n) for n in ("n1", "n2", "n3"))
        assert alive(stub) == {"n1": True, "n2": True, "n3": True}
        # the agent of the IN_FLIGHT order reports after the restart: accepted
        assert report(stub, moving, S.ORDER_STATE_COMMITTED) == S.ORDER_STATE_COMMITTED
        assert report(stub, committed, S.ORDER_STATE_COMMITTED) == S.ORDER_STATE_COMMITTED  # a retried ack
        assert report(stub, failed, S.ORDER_STATE_FAILED) == S.ORDER_STATE_FAILED
        assert first_watched(stub, "n1") == issued  # the ISSUED one is sent to its source again
        new = submit(stub, "n1", "n2")
        assert new not in (issued, moving, committed, failed)
        assert new > max(issued, moving, committed, failed)  # ids continue: o-00000005


def transports(stub) -> list[tuple[str, str, str, int, int]]:
    state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    return [(t.source_node, t.target_node, t.transport, t.orders, t.bytes) for t in state.transports]


def test_the_copies_by_transport_survive_a_restart(tmp_path):
    state_dir = str(tmp_path / "state")
    with scheduler(state_dir=state_dir) as (_, stub):
        for n in ("n1", "n2"):
            register(stub, n, f"127.0.0.1:{n[1]}")
        for transport, nbytes in (("tcp", 1000), ("tcp", 24), ("shm", 7), ("", 5)):
            ack = stub.ReportOrderStatus(scheduler_pb2.OrderStatusReport(
                order_id=submit(stub, "n1", "n2"), state=S.ORDER_STATE_COMMITTED, bytes_sent=nbytes,
                transport=transport), timeout=TIMEOUT)
            assert ack.state == S.ORDER_STATE_COMMITTED
        unlabelled = submit(stub, "n2", "n1")
        assert report(stub, unlabelled, S.ORDER_STATE_COMMITTED) == S.ORDER_STATE_COMMITTED
        before = transports(stub)
        assert ("n1", "n2", "tcp", 2, 1024) in before and ("n1", "n2", "shm", 1, 7) in before
        (back,) = [r for r in before if r[:2] == ("n2", "n1")]
        assert back[2:4] == ("", 1)  # no transport reported yet

    with scheduler(state_dir=state_dir) as (_, stub):
        assert transports(stub) == before
        # the source's late report after the restart labels the copy the restored tally holds unlabelled
        stub.ReportOrderStatus(scheduler_pb2.OrderStatusReport(
            order_id=unlabelled, state=S.ORDER_STATE_COMMITTED, transport="nixl"), timeout=TIMEOUT)
        after = transports(stub)
        assert [r for r in after if r[:2] == ("n2", "n1")] == [("n2", "n1", "nixl", 1, back[4])]

    with scheduler(state_dir=state_dir) as (_, stub):
        assert transports(stub) == after


def test_an_unusable_state_db_stops_the_start_with_a_clear_error(tmp_path):
    (tmp_path / DB_FILE).write_bytes(b"\0garbage" * 1000)
    config = SchedulerConfig(engine_profile="tiny", state_dir=str(tmp_path))
    with pytest.raises(FailedPrecondition, match=f"{DB_FILE} is corrupt or not a database"):
        build_server(config, build_telemetry("scheduler", {}))
    assert (tmp_path / DB_FILE).read_bytes() == b"\0garbage" * 1000  # never reset


# --- a scheduler process killed with SIGKILL --------------------------------
_LISTENING = re.compile(r"listening on (\S+:\d+)")


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def scheduler_process(state_dir: Path, log_path: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """`speckv scheduler --state-dir state_dir` on 127.0.0.1:<free port>; killed at exit if still running."""
    argv = [sys.executable, "-m", "speckv.services.cli", "scheduler", "--host", "127.0.0.1", "--port", "0",
            "--engine-profile", "tiny", "--tick-s", "0.05", "--state-dir", str(state_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPECKV_LOG_LEVEL": "WARNING"}
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env, preexec_fn=_die_with_parent)
    try:
        found: list[str] = []

        def read() -> None:
            assert popen.stdout is not None
            for raw in popen.stdout:  # drains to the end, so the child never blocks on a full pipe
                match = _LISTENING.search(raw.decode(errors="replace"))
                if match and not found:
                    found.append(match.group(1))

        threading.Thread(target=read, daemon=True).start()
        waiting = threading.Event()
        for _ in range(int(PROCESS_TIMEOUT / 0.05)):
            if found or popen.poll() is not None:
                break
            waiting.wait(0.05)
        assert found, f"the scheduler did not start: {log_path.read_text(errors='replace')[-2000:]}"
        yield popen, found[0]
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.wait(timeout=30)


def test_orders_survive_a_sigkill(tmp_path):
    state_dir, log_path = tmp_path / "state", tmp_path / "scheduler.log"
    with scheduler_process(state_dir, log_path) as (popen, address):
        with grpc.insecure_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            register(stub, "n1", "127.0.0.1:1")
            register(stub, "n2", "127.0.0.1:2")
            stub.SetPolicy(scheduler_pb2.SetPolicyRequest(name="reactive-heat"), timeout=TIMEOUT)
            orders = [submit(stub, "n1", "n2") for _ in range(5)]
            assert report(stub, orders[1], S.ORDER_STATE_IN_FLIGHT) == S.ORDER_STATE_IN_FLIGHT
            assert report(stub, orders[2], S.ORDER_STATE_COMMITTED) == S.ORDER_STATE_COMMITTED
        popen.send_signal(signal.SIGKILL)  # no shutdown hook runs: only what was committed remains
        assert popen.wait(timeout=30) == -signal.SIGKILL

    with scheduler_process(state_dir, log_path) as (_, address):
        with grpc.insecure_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            assert stub.GetPolicy(scheduler_pb2.GetPolicyRequest(), timeout=TIMEOUT).name == "reactive-heat"
            assert counts(stub) == {S.ORDER_STATE_ISSUED: 3, S.ORDER_STATE_IN_FLIGHT: 1, S.ORDER_STATE_COMMITTED: 1}
            assert alive(stub) == {"n1": False, "n2": False}
            assert heartbeat(stub, "n1") and heartbeat(stub, "n2")
            assert report(stub, orders[1], S.ORDER_STATE_COMMITTED) == S.ORDER_STATE_COMMITTED
            assert report(stub, orders[0], S.ORDER_STATE_IN_FLIGHT) == S.ORDER_STATE_IN_FLIGHT
            new = submit(stub, "n1", "n2")
            assert new not in orders and new > max(orders)
