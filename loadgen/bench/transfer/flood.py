"""Replication while the target's data port is flooded with connections
that never authenticate (`speckv bench transfer --flood N`; issue 43, item
1, whose target is >= 0.8x the idle throughput with 1,000 such connections
opened and re-opened for 60 s).

One protected kvstore pair (data_plane_auth on, registered with a
scheduler in this process, as transfer/protect.py does; TLS off, so the
flood is the only difference). Phases, in order: `repeats` idle
replications; then the flood (chaos/flood.py: N connections spread over
`sources` loopback addresses, each re-opened every `reopen_s`, and when
the node closes it at once (eager) or at its next tick (--flood-paced);
run from a thread of this process) for at least
`flood_s` seconds, replicating back to back the whole time (at least
`repeats` times); then `repeats` idle ones again. GB/s = bytes / Replicate
call time; ratio = median flooded / median idle (both idle phases).

With `pin` (--flood-pin), the kvstore processes run on CPU 0 only and this
process (the flood, the scheduler, the Replicate client) on the other CPUs,
in every phase: the attacker's own CPU then comes out of the measurement,
as it would from another machine, and what remains is what the flood costs
the nodes (the doorway's accepts and refusals, the kernel's share on their
CPU). Without it, on a small machine the flood's client competes with the
replication for the same cores.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any, Mapping

from speckv.loadgen.bench.chaos.flood import Flood, loopback_sources
from speckv.loadgen.bench.transfer.procs import KVStoreProcess, start_kvstore
from speckv.loadgen.bench.transfer.protect import BenchFactory, _wait_registered
from speckv.services.common.config import parse_config
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.kvstore.dataplane.tcp_target import split_address
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.server import build_server
from speckv.v1 import kvstore_pb2

REOPEN_S = 0.25  # 4x faster than the default data_auth_timeout_s


def flooded(args: list[str], chunk_bytes: int, repeats: int, environ: Mapping[str, str], make_bench: BenchFactory,
            *, connections: int, sources: int, flood_s: float, pin: bool = False,
            eager: bool = True) -> dict[str, Any]:
    config = parse_config(SchedulerConfig, ["--port", "0", "--host", "127.0.0.1", "--tick-s", "3600",
                                            "--node-timeout-s", "3600"], {}, prog="bench")
    scheduler = build_server(config, build_telemetry("scheduler", {})).start()
    processes: list[KVStoreProcess] = []
    try:
        common = [*args, "--scheduler", scheduler.address, "--heartbeat-interval-s", "1", "--data-plane-auth", "on"]
        for node in ("flood-src", "flood-dst"):
            processes.append(start_kvstore(node, common, environ=environ))
        _wait_registered(scheduler.address, {p.node_id for p in processes})
        source, target = processes
        if pin:
            for pid in (source.pid, target.pid):
                _pin(pid, {0})
            _pin(os.getpid(), set(range(1, os.cpu_count() or 2)))
        replicate = make_bench(source, target)
        replicate("tcp", chunk_bytes)  # warm-up: touches every page of both pools
        idle = [replicate("tcp", chunk_bytes) for _ in range(repeats)]
        flood = Flood(_data_address(target, source.node_id), connections, loopback_sources(sources), REOPEN_S,
                      eager)
        flood.start()
        under: list[float] = []
        started = time.monotonic()
        try:
            while len(under) < repeats or time.monotonic() - started < flood_s:
                under.append(replicate("tcp", chunk_bytes))
        finally:
            counts = flood.stop()
        flood_seconds = time.monotonic() - started
        idle += [replicate("tcp", chunk_bytes) for _ in range(repeats)]
        row = {"transport": "tcp", "chunk_bytes": chunk_bytes, "connections": connections, "sources": sources,
               "reopen_s": REOPEN_S, "pinned": pin,
               "eager": eager, "flood_seconds": round(flood_seconds, 1), "idle_runs_gbps": idle,
               "flooded_runs_gbps": under, "idle_median_gbps": statistics.median(idle),
               "flooded_median_gbps": statistics.median(under), "flood_opened": counts.opened,
               "flood_closed_by_node": counts.closed_by_node, "flood_connect_failed": counts.connect_failed}
        row["ratio_median"] = row["flooded_median_gbps"] / row["idle_median_gbps"]
        return row
    finally:
        if pin:
            _pin(os.getpid(), set(range(os.cpu_count() or 1)))
        for process in processes:
            process.stop()
        scheduler.stop(grace_s=1.0)


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of pid onto cpus (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def _data_address(target: KVStoreProcess, source_node: str) -> tuple[str, int]:
    """Where the target's data plane listens: a reservation's data address."""
    grant = target.stub.Reserve(kvstore_pb2.ReserveRequest(order_id="flood-probe", block_hashes=[1], lease_ms=5_000,
                                                           source_node=source_node), timeout=30.0)
    target.stub.Abort(kvstore_pb2.AbortRequest(handle=grant.handle, capability=grant.capability,
                                               capability_secret=grant.capability_secret), timeout=30.0)
    return split_address(grant.data_address)
