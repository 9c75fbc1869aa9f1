"""Replication with the data plane's protection on against off, in one run
(`speckv bench transfer`, section "protection"; docs/security.md).

Two pairs of kvstore processes on loopback, the same geometry and pool
size: one pair with `--data-plane-auth off` (as before issue 23), one with
`--data-plane-auth on` (write capabilities on every reservation write,
replicas only to registered nodes' registered addresses, learned from a
scheduler both pairs register with). TLS is off on both, so the difference
is the protection alone. After one untimed warm-up per pair, the timed
replications alternate off, on, off, on ... so both see the same machine
load; GB/s = bytes / Replicate call time (tcp data plane, the default
chunk), best and median of `repeats`. ratio = on / off (target >= 0.8).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping

from speckv.loadgen.bench.transfer.procs import KVStoreProcess, start_kvstore
from speckv.services.common.config import parse_config
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.server import build_server
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc

REGISTER_TIMEOUT_S = 60.0

Replicate = Callable[[str, int], float]  # (transport, chunk bytes) -> GB/s
BenchFactory = Callable[[KVStoreProcess, KVStoreProcess], Replicate]


def protection(args: list[str], chunk_bytes: int, repeats: int, environ: Mapping[str, str],
               make_bench: BenchFactory) -> dict[str, Any]:
    """Runs the comparison; make_bench(source, target) -> a replicate function."""
    config = parse_config(SchedulerConfig, ["--port", "0", "--host", "127.0.0.1", "--tick-s", "3600",
                                            "--node-timeout-s", "3600"], {}, prog="bench")
    scheduler = build_server(config, build_telemetry("scheduler", {})).start()
    processes: list[KVStoreProcess] = []
    try:
        common = [*args, "--scheduler", scheduler.address, "--heartbeat-interval-s", "1"]
        for node, auth in (("plain-src", "off"), ("plain-dst", "off"), ("prot-src", "on"), ("prot-dst", "on")):
            processes.append(start_kvstore(node, [*common, "--data-plane-auth", auth], environ=environ))
        _wait_registered(scheduler.address, {p.node_id for p in processes})
        plain, protected = make_bench(processes[0], processes[1]), make_bench(processes[2], processes[3])
        plain("tcp", chunk_bytes)  # warm-up: touches every page of both pools
        protected("tcp", chunk_bytes)
        off, on = [], []
        for _ in range(repeats):
            off.append(plain("tcp", chunk_bytes))
            on.append(protected("tcp", chunk_bytes))
        row = {"transport": "tcp", "chunk_bytes": chunk_bytes, "off_gbps": max(off), "on_gbps": max(on),
               "off_median_gbps": statistics.median(off), "on_median_gbps": statistics.median(on),
               "off_runs_gbps": off, "on_runs_gbps": on}
        row["ratio"] = row["on_gbps"] / row["off_gbps"]
        row["ratio_median"] = row["on_median_gbps"] / row["off_median_gbps"]
        return row
    finally:
        for process in processes:
            process.stop()
        scheduler.stop(grace_s=1.0)


def _wait_registered(address: str, nodes: set[str]) -> None:
    import grpc

    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        while time.monotonic() < deadline:
            state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=10.0)
            if nodes <= {n.node_id for n in state.nodes}:
                return
            time.sleep(0.1)
    raise RuntimeError(f"kvstores {sorted(nodes)} did not register with the bench's scheduler")
