"""`speckv bench scheduler [--quick] [--json PATH]`: how fast the placement
scheduler routes and plans on a synthetic cluster of 1,000 nodes, 1,000,000
indexed blocks and 100,000 prefix families (see scheduler/synth.py).

Measured, in this order:
- route_inproc_us: SchedulerCore.route in this process (p50/p99, us of wall
  time), and route_inproc_cpu_us: the same calls' CPU time (this thread's),
  which leaves out the time the machine's other work held the core (on 2
  shared cores a preempted call waits a scheduler slice, ~4 ms, and that, not
  the code, is then the wall p99);
- plan_tick_ms (and plan_tick_cpu_ms, its CPU time): SchedulerCore.tick with
  the `predictive` policy (the heaviest planner) fed by a
  synthetic forecast of the 256 most popular families, a tenth of them
  bursting (p50/p99, ms; issued orders are reported committed between ticks);
- route_grpc_ms next to empty_grpc_ms: Route against a real scheduler process
  over loopback, alternating call by call with the standard health Check (the
  empty unary call: the floor of Python gRPC on this machine), p50/p99 ms;
- route_grpc_per_s: Route calls/s from 4 client threads, next to the same for
  the empty call (empty_grpc_per_s), and routes/s through RouteBatch of 64
  (route_batch_per_s); beside each rate, the scheduler process's CPU time per
  call over it (route_grpc_server_cpu_us, empty_grpc_server_cpu_us, us of
  user + system time from /proc): what one call costs the server whatever
  else the machine runs, so 1e6 / route_grpc_server_cpu_us is the Routes/s
  one replica with a core of its own could answer;
- state_dir: what the durable control state costs (docs/state.md). Two
  `speckv scheduler` processes of 16 nodes, one in memory and one with
  --state-dir (SQLite), called in turn call by call: Route (writes nothing)
  and SubmitOrder (one transaction each), p50/p99 ms per process.
- tls (with --tls): what mutual TLS costs (docs/security.md). Two `speckv
  scheduler` processes of 16 nodes, one plaintext and one with --tls-*
  (certificates made in a temporary folder), called in turn call by call:
  Route and the empty health Check, p50/p99 ms per process; target: TLS
  Route p99 <= 1.3 x plaintext's.
Targets: in-process route p99 < 100 us; tick p99 < 100 ms; gRPC
route p99 <= 1.5 x the empty call's p99; >= 1,500 routes/s. Numbers, not
pass/fail tests: a shared machine is noisy, so read them with the
ceiling measured beside them.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from speckv.loadgen.bench.scheduler.failover import FailoverSettings, run_failover
from speckv.loadgen.bench.scheduler.synth import PROFILE, SyntheticCluster, SyntheticForecasts, SynthShape
from speckv.services.cluster.certs import make_bundle
from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.rpc.tls import dial
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.ports import SchedulerSettings
from speckv.services.scheduler.orders import OrderState
from speckv.services.scheduler.routing.route_records import RouteRequestItem
from speckv.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    parser = argparse.ArgumentParser(prog="speckv bench scheduler")
    parser.add_argument("--quick", action="store_true", help="fewer samples (same cluster shape)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--families", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tls", action="store_true",
                        help="also compare Route with and without mutual TLS (two 16-node scheduler processes)")
    parser.add_argument("--replicas", type=int, default=0,
                        help="instead: the failover drill of N scheduler replicas on etcd, the leader killed -9 "
                             "under load (loadgen/bench/scheduler/failover.py)")
    args = parser.parse_args(argv)
    if args.replicas:
        return failover_main(args.replicas, args.quick, args.json, environ)
    logging.getLogger("speckv.services.scheduler").setLevel(logging.WARNING)  # 1,000 registrations
    shape = SynthShape(args.nodes, args.blocks, args.families, seed=args.seed)
    n_routes, n_ticks, n_calls, seconds = (5_000, 20, 1_000, 3.0) if args.quick else (50_000, 100, 5_000, 10.0)
    print(f"synthetic cluster: {shape.nodes} nodes, {shape.blocks} blocks, {shape.families} families "
          f"(profile {PROFILE})", flush=True)
    results: dict[str, object] = {"shape": {"nodes": shape.nodes, "blocks": shape.blocks,
                                            "families": shape.families}, "quick": args.quick}
    results.update(_inproc(shape, n_routes, n_ticks))
    _show("in-process route", results["route_inproc_us"], "us", 100.0)
    _show("in-process route, CPU time", results["route_inproc_cpu_us"], "us", None)
    _show("planner tick", results["plan_tick_ms"], "ms", 100.0)
    _show("planner tick, CPU time", results["plan_tick_cpu_ms"], "ms", None)
    results.update(_grpc(shape, n_calls, seconds))
    _show("gRPC route", results["route_grpc_ms"], "ms", 1.5 * results["empty_grpc_ms"]["p99"])
    _show("gRPC empty call", results["empty_grpc_ms"], "ms", None)
    print(f"gRPC route throughput: {results['route_grpc_per_s']:.0f}/s (target >= 1500; empty call "
          f"{results['empty_grpc_per_s']:.0f}/s); RouteBatch(64): {results['route_batch_per_s']:.0f} routes/s")
    print(f"scheduler CPU per call: route {results['route_grpc_server_cpu_us']:.0f} us, empty call "
          f"{results['empty_grpc_server_cpu_us']:.0f} us (1e6 / route = "
          f"{1e6 / results['route_grpc_server_cpu_us']:.0f} routes/s on a core of its own)")
    results["state_dir"] = _state_dir(n_calls)
    for rpc, by_mode in results["state_dir"].items():
        for mode, p in by_mode.items():
            _show(f"{rpc} ({mode})", p, "ms", None)
    if args.tls:
        results["tls"] = tls_versus_plaintext(n_calls)
        for rpc, by_mode in results["tls"].items():
            for mode, p in by_mode.items():
                target = 1.3 * results["tls"]["route_ms"]["plaintext"]["p99"] \
                    if (rpc, mode) == ("route_ms", "tls") else None
                _show(f"{rpc} ({mode})", p, "ms", target)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 0


def failover_main(replicas: int, quick: bool, json_path: str | None, environ: Mapping[str, str]) -> int:
    if replicas < 2:
        raise SystemExit(f"--replicas {replicas}: a failover needs at least 2")
    settings = FailoverSettings(replicas=replicas, seconds=8.0 if quick else 12.0)
    print(f"failover drill: {replicas} scheduler replicas on etcd, 3 kvstores; the leader gets SIGKILL "
          f"{settings.kill_at_s:.0f} s into {settings.seconds:.0f} s of routes and orders", flush=True)
    results = run_failover(settings, environ)
    failover = results["failover_s"]
    print(f"failover: {'none (no replica took over)' if failover is None else f'{failover:.2f} s'} "
          f"(bound: two leases, {results['failover_bound_s']} s; target <= 5 s)")
    print(f"orders: {results['orders_accepted']} accepted, {results['orders_committed']} committed, "
          f"lost {results['orders_lost']}, duplicated {results['orders_duplicated']}, "
          f"stuck {results['orders_stuck']} (targets: 0 lost, 0 duplicated)")
    gap = results["max_route_gap_s"]
    print(f"routes: {results['routes']}, unanswered {results['route_unanswered']} (target 0), "
          f"retried on another replica {results['routes_retried']}, longest gap between answers "
          f"{'-' if gap is None else f'{gap * 1e3:.0f} ms'}")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 0


def _inproc(shape: SynthShape, n_routes: int, n_ticks: int) -> dict[str, object]:
    cluster = SyntheticCluster(shape)
    clock = ManualClock(1000.0)
    core = SchedulerCore(SchedulerSettings(node_timeout_s=3600.0, heartbeat_interval_ms=1000, policy="predictive"),
                         clock, get_profile(PROFILE), forecasts=SyntheticForecasts(cluster))
    cluster.populate(core)
    gc.freeze()
    requests = cluster.requests(n_routes + 2_000)
    route_us, route_cpu_us = [], []
    for i, r in enumerate(requests):
        if i % 20 == 0:
            cluster.heartbeat(core, cluster.node_ids[i % len(cluster.node_ids)])
        start = time.perf_counter_ns()
        cpu_start = time.thread_time_ns()
        core.route(r.request_id, r.block_hashes, r.prompt_tokens, r.family)
        cpu = time.thread_time_ns() - cpu_start
        elapsed = time.perf_counter_ns() - start
        if i >= 2_000:  # the first 2,000 warm up
            route_us.append(elapsed / 1e3)
            route_cpu_us.append(cpu / 1e3)
    tick_ms, tick_cpu_ms, issued = [], [], 0
    for _ in range(n_ticks):
        clock.advance(0.25)
        start, cpu_start = time.perf_counter_ns(), time.thread_time_ns()
        orders = core.tick()
        tick_cpu_ms.append((time.thread_time_ns() - cpu_start) / 1e6)
        tick_ms.append((time.perf_counter_ns() - start) / 1e6)
        issued += len(orders)
        for order in orders:
            core.report_order(order.order_id, OrderState.COMMITTED)
    print(f"planner: {issued} orders over {n_ticks} ticks", flush=True)
    return {"route_inproc_us": _pcts(route_us), "route_inproc_cpu_us": _pcts(route_cpu_us),
            "plan_tick_ms": _pcts(tick_ms), "plan_tick_cpu_ms": _pcts(tick_cpu_ms), "plan_orders": issued}


def _grpc(shape: SynthShape, n_calls: int, seconds: float) -> dict[str, object]:
    server = subprocess.Popen([sys.executable, "-m", "speckv.loadgen.bench.scheduler.server", str(shape.nodes),
                               str(shape.blocks), str(shape.families), str(shape.seed)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"the scheduler process did not start (said {line!r})")
        address = line.split()[1]
        requests = [_proto(r) for r in SyntheticCluster(shape).requests(max(n_calls, 20_000))]
        with grpc.insecure_channel(address) as channel:
            route = scheduler_pb2_grpc.SchedulerStub(channel).Route
            batch = scheduler_pb2_grpc.SchedulerStub(channel).RouteBatch
            check = health_pb2_grpc.HealthStub(channel).Check
            empty = health_pb2.HealthCheckRequest()
            route_ms, empty_ms = _alternate(lambda i: route(requests[i % len(requests)], timeout=10),
                                            lambda i: check(empty, timeout=10), n_calls)
            route_rate, route_cpu_us = _rate_and_cpu(lambda i: route(requests[i % len(requests)], timeout=10),
                                                     seconds, server.pid)
            empty_rate, empty_cpu_us = _rate_and_cpu(lambda i: check(empty, timeout=10), seconds, server.pid)
            batches = [scheduler_pb2.RouteBatchRequest(requests=requests[j:j + 64])
                       for j in range(0, len(requests) - 64, 64)]
            batch_rate = 64 * _rate(lambda i: batch(batches[i % len(batches)], timeout=10), seconds)
    finally:
        server.stdin.close()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
    return {"route_grpc_ms": _pcts(route_ms), "empty_grpc_ms": _pcts(empty_ms), "route_grpc_per_s": route_rate,
            "empty_grpc_per_s": empty_rate, "route_batch_per_s": batch_rate,
            "route_grpc_server_cpu_us": route_cpu_us, "empty_grpc_server_cpu_us": empty_cpu_us}


STATE_NODES = 16
_LISTENING = re.compile(r"listening on (\S+:\d+)")


def _state_dir(n_calls: int) -> dict[str, dict[str, dict[str, float]]]:
    """Route and SubmitOrder against a scheduler in memory and one with
    --state-dir, alternating call by call so both see the same machine;
    ms per call, {rpc: {"memory" | "state_dir": percentiles}}."""
    with tempfile.TemporaryDirectory(prefix="speckv-bench-state-") as tmp:
        servers = {"memory": _start_scheduler([], Path(tmp) / "memory.log"),
                   "state_dir": _start_scheduler(["--state-dir", str(Path(tmp) / "state")], Path(tmp) / "state.log")}
        channels = {mode: grpc.insecure_channel(address) for mode, (_, address) in servers.items()}
        try:
            stubs = {mode: scheduler_pb2_grpc.SchedulerStub(channel) for mode, channel in channels.items()}
            for stub in stubs.values():
                for i in range(STATE_NODES):  # nothing listens at port 9: no kvstore to follow
                    stub.RegisterNode(scheduler_pb2.RegisterNodeRequest(
                        node_id=f"n{i:02d}", address="127.0.0.1:9", capacity_pages=16_384), timeout=10)
            rng = np.random.default_rng(0)
            routes = [scheduler_pb2.RouteRequest(request_id=f"r{i}", block_hashes=rng.integers(1, 1 << 62, 8).tolist(),
                                                 prompt_tokens=8 * 16 + 5, family=f"fam{i % 100}")
                      for i in range(1_000)]

            def order(i: int) -> scheduler_pb2.SubmitOrderRequest:
                return scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
                    family=f"fam{i % 100}", block_hashes=[4 * i + 1, 4 * i + 2, 4 * i + 3, 4 * i + 4],
                    source_node=f"n{i % STATE_NODES:02d}", target_node=f"n{(i + 1) % STATE_NODES:02d}",
                    lease_ms=3_600_000))

            calls = [(f"{rpc}_ms", mode, fn) for rpc, fn in (
                ("route", lambda stub, i: stub.Route(routes[i % len(routes)], timeout=10)),
                ("submit_order", lambda stub, i: stub.SubmitOrder(order(i), timeout=10))) for mode in stubs]
            times = _interleave([lambda i, fn=fn, stub=stubs[mode]: fn(stub, i) for _, mode, fn in calls], n_calls)
        finally:
            _stop_all(channels, servers)
    return _by_rpc_and_mode(calls, times)


def tls_versus_plaintext(n_calls: int) -> dict[str, dict[str, dict[str, float]]]:
    """Route and the empty health Check against a plaintext scheduler and a
    mutual-TLS one, alternating call by call; ms per call, {rpc: {"plaintext"
    | "tls": percentiles}}. Each node registers with its own certificate
    (the TLS scheduler accepts nothing else); the calls are the admin's."""
    nodes = [f"n{i:02d}" for i in range(STATE_NODES)]
    with tempfile.TemporaryDirectory(prefix="speckv-bench-tls-") as tmp:
        certs = make_bundle(Path(tmp) / "tls", nodes)
        sched = certs.service("scheduler")
        servers = {"plaintext": _start_scheduler([], Path(tmp) / "plaintext.log"),
                   "tls": _start_scheduler(["--tls-cert", sched.cert, "--tls-key", sched.key, "--tls-ca", sched.ca],
                                           Path(tmp) / "tls.log")}
        tls = {"plaintext": None, "tls": certs.admin.load()}
        channels = {mode: dial(address, tls[mode], "scheduler") for mode, (_, address) in servers.items()}
        try:
            for mode, (_, address) in servers.items():
                for node in nodes:
                    node_tls = certs.node(node).load() if tls[mode] is not None else None
                    with dial(address, node_tls, "scheduler") as channel:
                        scheduler_pb2_grpc.SchedulerStub(channel).RegisterNode(scheduler_pb2.RegisterNodeRequest(
                            node_id=node, address="127.0.0.1:9", capacity_pages=16_384), timeout=10)
            rng = np.random.default_rng(0)
            routes = [scheduler_pb2.RouteRequest(request_id=f"r{i}", block_hashes=rng.integers(1, 1 << 62, 8).tolist(),
                                                 prompt_tokens=8 * 16 + 5, family=f"fam{i % 100}")
                      for i in range(1_000)]
            empty = health_pb2.HealthCheckRequest()
            stubs = {mode: (scheduler_pb2_grpc.SchedulerStub(c), health_pb2_grpc.HealthStub(c))
                     for mode, c in channels.items()}
            calls = [("route_ms", mode, lambda i, s=stubs[mode][0]: s.Route(routes[i % len(routes)], timeout=10))
                     for mode in stubs]
            calls += [("empty_ms", mode, lambda i, h=stubs[mode][1]: h.Check(empty, timeout=10)) for mode in stubs]
            times = _interleave([fn for _, _, fn in calls], n_calls)
        finally:
            _stop_all(channels, servers)
    return _by_rpc_and_mode(calls, times)


def _start_scheduler(args: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    """A `speckv scheduler` process on 127.0.0.1:<free port> that never marks
    a node down nor asks a kvstore (its nodes are names only): (process, address)."""
    argv = [sys.executable, "-m", "speckv.services.cli", "scheduler", "--host", "127.0.0.1", "--port", "0",
            "--engine-profile", PROFILE, "--no-confirm-routes", "--node-timeout-s", "86400", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPECKV_LOG_LEVEL": "WARNING"}
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env)
    assert popen.stdout is not None
    for raw in popen.stdout:
        match = _LISTENING.search(raw.decode(errors="replace"))
        if match:
            # nothing else is printed on stdout, so the pipe never fills
            return popen, match.group(1)
    popen.wait(timeout=15)
    raise RuntimeError(f"the scheduler process did not start: {log_path.read_text(errors='replace')[-2000:]}")


def _interleave(fns: list[Callable[[int], object]], n: int, warmup: int = 200) -> list[list[float]]:
    """Calls each of fns in turn, n times each after `warmup` rounds; ms per call, per fn."""
    times: list[list[float]] = [[] for _ in fns]
    for i in range(n + warmup):
        for fn, samples in zip(fns, times):
            start = time.perf_counter_ns()
            fn(i)
            if i >= warmup:
                samples.append((time.perf_counter_ns() - start) / 1e6)
    return times


def _alternate(a: Callable[[int], object], b: Callable[[int], object], n: int) -> tuple[list[float], list[float]]:
    """Calls a and b in turn n times each (after 200 warm-up pairs); ms each."""
    times_a, times_b = [], []
    for i in range(n + 200):
        for fn, times in ((a, times_a), (b, times_b)):
            start = time.perf_counter_ns()
            fn(i)
            if i >= 200:
                times.append((time.perf_counter_ns() - start) / 1e6)
    return times_a, times_b


def _rate(fn: Callable[[int], object], seconds: float, threads: int = 4) -> float:
    """Calls per second of fn from `threads` threads for `seconds`."""
    stop = threading.Event()
    counts = [0] * threads

    def work(t: int) -> None:
        i = t * 1_000_003
        while not stop.is_set():
            fn(i)
            i += 1
            counts[t] += 1

    workers = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    stop.wait(seconds)
    stop.set()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - start)


def _rate_and_cpu(fn: Callable[[int], object], seconds: float, pid: int) -> tuple[float, float]:
    """_rate, and the CPU time (us) process pid spent per call meanwhile."""
    before, started = _cpu_s(pid), time.perf_counter()
    rate = _rate(fn, seconds)
    calls = rate * (time.perf_counter() - started)
    return rate, (_cpu_s(pid) - before) * 1e6 / max(calls, 1.0)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process pid so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proto(r: RouteRequestItem) -> scheduler_pb2.RouteRequest:
    return scheduler_pb2.RouteRequest(request_id=r.request_id, block_hashes=r.block_hashes,
                                      prompt_tokens=r.prompt_tokens, family=r.family)


def _pcts(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "n": int(a.size)}


def _show(what: str, p: dict[str, float], unit: str, target: float | None) -> None:
    goal = f" (target p99 < {target:.3g} {unit})" if target is not None else ""
    print(f"{what}: p50 {p['p50']:.3f} {unit}, p99 {p['p99']:.3f} {unit}{goal}", flush=True)


def _stop_all(channels: dict, servers: dict) -> None:
    """Closes the channels, then stops each scheduler process (killed past 15 s)."""
    for channel in channels.values():
        channel.close()
    for popen, _ in servers.values():
        popen.terminate()
        try:
            popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=15)


def _by_rpc_and_mode(calls: list, times: list) -> dict[str, dict[str, dict[str, float]]]:
    """Percentiles per (rpc, mode) of the interleaved calls' samples."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (rpc, mode, _), samples in zip(calls, times):
        out.setdefault(rpc, {})[mode] = _pcts(samples)
    return out
