"""The reference router's replay survives its scheduler (issue 43, item 7):
a scheduler process on a fixed port with a --state-dir, three kvstore
processes registered with it, and a replay through the reference router
(emulated engines in this process, routing through services/client). The
scheduler is SIGKILLed mid-replay, then started again on its port: no
request is lost (every one served), those sent while it was down were
placed by the client's fallback, and once it is back (the kvstores
re-registered) routing returns to it."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Iterator

import grpc

from speckv.loadgen.bench.transfer.procs import KVStoreProcess, read_address, start_kvstore
from speckv.loadgen.engines.driver import LiveEngines, TraceClock
from speckv.loadgen.engines.emulated import EmulatedEngine
from speckv.loadgen.experiments.metrics import RequestRecord
from speckv.loadgen.experiments.reference_router import ReferenceRouter
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger
from speckv.loadgen.workload.replay import TimeMap
from speckv.services.client.breaker import BreakerSettings, BreakerState
from speckv.services.client.routing import SCHEDULER_CHANNEL_OPTIONS, ClientSettings, RoutingClient
from speckv.services.cluster.parent_death import child_environ
from speckv.services.common.traces import TraceRequest
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.support.engine_cases import KV_PER_TOKEN, LIMITS, LINK, PROFILE
from tests.support.kvstore_procs import GEOMETRY
from tests.support.waiting import wait_until

NODES = ("n1", "n2", "n3")
BLOCK = GEOMETRY.block_size
FAMILIES = 4
START_TIMEOUT_S = 60.0  # a deadline for a process to serve, not an expectation


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_scheduler(port: int, state_dir: Path, log_path: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "speckv.services.cli", "scheduler", "--host", "127.0.0.1", "--port", str(port),
            "--engine-profile", "tiny", "--tick-s", "0.05", "--state-dir", str(state_dir)]
    env = child_environ({**os.environ, "PYTHONUNBUFFERED": "1", "SPECKV_LOG_LEVEL": "WARNING"})
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:  # the port may linger a moment after a kill
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env)
        if read_address(popen, START_TIMEOUT_S) is not None:
            return popen
        popen.kill()
        popen.wait(30)
        assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-2000:]
        time.sleep(0.5)


@contextlib.contextmanager
def _kvstores(scheduler_address: str) -> Iterator[dict[str, KVStoreProcess]]:
    args = ["--geometry", "tiny", "--block-size", str(BLOCK), "--scheduler", scheduler_address,
            "--heartbeat-interval-s", "0.2", "--device-pages", "256"]
    with futures.ThreadPoolExecutor(len(NODES)) as pool:
        started = list(pool.map(lambda n: start_kvstore(n, args), NODES))
        try:
            yield {p.node_id: p for p in started}
        finally:
            for process in started:
                process.stop(grace_s=2.0)


def _alive(channel: grpc.Channel) -> set[str]:
    try:
        state = scheduler_pb2_grpc.SchedulerStub(channel).GetClusterState(scheduler_pb2.ClusterStateRequest(),
                                                                          timeout=2.0)
    except grpc.RpcError:
        return set()
    return {n.node_id for n in state.nodes if n.alive}


def _request(i: int) -> TraceRequest:
    family = 50_000 + (i % FAMILIES) * 100
    hashes = (family, family + 1, 60_000 + i)
    return TraceRequest(0.0, len(hashes) * BLOCK + 5, 8, hashes, BLOCK, str(family))


def test_killing_the_scheduler_mid_replay_loses_no_request_and_routing_returns(tmp_path):
    port = _free_port()
    address = f"127.0.0.1:{port}"
    state_dir, log_path = tmp_path / "state", tmp_path / "scheduler.log"
    scheduler = _start_scheduler(port, state_dir, log_path)
    done: list[RequestRecord] = []
    lock = threading.Lock()

    def on_done(record: RequestRecord) -> None:
        with lock:
            done.append(record)

    try:
        with _kvstores(address) as procs, \
                grpc.insecure_channel(address, options=SCHEDULER_CHANNEL_OPTIONS) as channel:
            assert wait_until(lambda: _alive(channel) == set(NODES))
            kv = {n: grpc.insecure_channel(p.address) for n, p in procs.items()}
            engines = {n: EmulatedEngine(n, PROFILE, LIMITS, LINK, KV_PER_TOKEN) for n in NODES}
            box: list[ReferenceRouter] = []
            live = LiveEngines(engines, TraceClock(TimeMap(time.monotonic(), 0.0, 1.0)), channel,
                               lambda events: box[0].on_engine_events(events), heartbeat_s=3600.0)
            client = RoutingClient(channel, nodes={n: p.address for n, p in procs.items()}, settings=ClientSettings(
                deadline_s=2.0, breaker=BreakerSettings(failures_to_open=2, open_s=0.5)))
            router = ReferenceRouter(channel, kv, live, PROFILE, ReplicaLedger(), threading.Lock(),
                                     GEOMETRY.bytes_per_block, KV_PER_TOKEN, on_done=on_done, workers=4,
                                     client=client)
            box.append(router)
            live.start()
            sent = 0
            try:
                def replay(n: int) -> None:
                    nonlocal sent
                    for _ in range(n):
                        router.send(sent, _request(sent))
                        sent += 1
                        time.sleep(0.02)

                replay(10)
                assert wait_until(lambda: client.counters().routes_scheduler >= 5)
                scheduler.send_signal(signal.SIGKILL)  # mid-replay: no shutdown hook runs
                assert scheduler.wait(30) == -signal.SIGKILL
                replay(20)  # the scheduler is down throughout
                assert wait_until(lambda: router.pending() == 0)
                during = client.counters()
                assert during.routes_fallback >= 20 and during.breaker_opens >= 1

                scheduler = _start_scheduler(port, state_dir, log_path)
                assert wait_until(lambda: _alive(channel) == set(NODES))  # the kvstores re-registered

                def closed_after_one_more() -> bool:
                    """Sends one request (a probe once the breaker half-opens) and says whether it closed."""
                    replay(1)
                    return client.breaker_state is BreakerState.CLOSED

                assert wait_until(closed_after_one_more, timeout=20.0)
                before = client.counters()
                replay(10)
                assert wait_until(lambda: router.pending() == 0)
                after = client.counters()
            finally:
                live.stop()
                router.close()
                for c in kv.values():
                    c.close()
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
        scheduler.wait(30)

    assert len(done) == sent == len({r.request_id for r in done})
    lost = [f"{r.request_id}: {r.error}" for r in done if not r.served]
    assert lost == []
    # Back: every route after the breaker closed came from the scheduler.
    assert after.routes_scheduler - before.routes_scheduler == 10
    assert after.routes_fallback == before.routes_fallback
