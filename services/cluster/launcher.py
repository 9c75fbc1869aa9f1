"""The embedded local cluster: predictor, scheduler and N kvstore nodes, each
its own `speckv` process on loopback.

Children get SIGTERM when the launcher dies (PR_SET_PDEATHSIG, asked for by
each child itself: parent_death.py), so no process outlives it even on a
crash; `stop()` sends SIGTERM to all, lets them drain, and SIGKILLs what is
left after the grace period. Each child logs to
`<run_dir>/<name>.log`; the first line a service prints names its address.
With `metrics_port_base` set, each service also serves Prometheus /metrics on a
port of its own (`metrics_ports`), named in cluster.json.

With `tls` set, the launcher first makes a throwaway CA and a certificate per
service in `<run_dir>/tls` (certs.py), starts every service with mutual TLS
and talks to them as the admin; cluster.json names the admin's files, so
`speckv status` finds them. Without it no child inherits SPECKV_TLS_* from
the launcher's environment (a stray admin certificate would not be a node's).

Membership at runtime (issue 27): `add_node()` starts one more kvstore node
(the next free id, node-N; with TLS a certificate from the same CA) that
registers with the running scheduler; `kill_node(name)` SIGKILLs one (a
crash: the scheduler sees its event stream close); `remove_node(name)`
stops one with SIGTERM and its grace period (the scheduler sees the same
close). Nodes added later are started from one spawner thread that lives
as long as the cluster, because Linux ties a child's parent-death signal to
the thread that started it. cluster.json is rewritten after each change.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent import futures
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from speckv.services.cluster.certs import CertBundle, issue_node, make_bundle
from speckv.services.cluster.etcd_process import client_context, wait_healthy
from speckv.services.cluster.ports import free_ports
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.cluster.parent_death import child_environ
from speckv.services.common.rpc.tls import TlsFiles, TlsMaterial, dial
from speckv.services.scheduler.leadership.adapters.etcd_endpoints import EtcdTls
from speckv.v1 import scheduler_pb2, scheduler_pb2_grpc

_LISTENING = re.compile(r"listening on (\S+:\d+)")


def default_run_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("SPECKV_RUN_DIR") or f"/tmp/speckv-{os.getuid()}/cluster")


@dataclass(slots=True)
class ServiceProcess:
    """One running service: `address` is host:port of its gRPC server."""

    name: str
    kind: str
    address: str
    pid: int
    log_path: str
    metrics_address: str = ""  # host:port of its /metrics endpoint; empty: none


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int = 3
    host: str = "127.0.0.1"
    geometry: str = "tiny"
    block_size: int = 0  # 0: the geometry preset's
    # Each node's tiers (--device-pages, --host-pages); its retention cap is the
    # kvstore's own (--retain-max-share among extra_args), so none is set here.
    sizes: NodeSizes = NodeSizes(4096)
    policy: str = "none"
    extra_args: Mapping[str, Sequence[str]] = field(default_factory=dict)  # per kind
    metrics_port_base: int = 0  # 0: no /metrics endpoints; else see metrics_ports
    tls: bool = False  # mutual TLS everywhere, with certificates made at start (module docstring)
    # Scheduler replicas (docs/replicas.md): >1 starts a one-member etcd (`speckv etcd`) and that many
    # schedulers, scheduler-0.., electing their leader on it; every node is told of every replica.
    replicas: int = 1


def metrics_ports(base: int, nodes: int) -> dict[str, int]:
    """Each service's /metrics port from base: the predictor base, the
    scheduler base + 1, node-i base + 2 + i; {} when base is 0 (off)."""
    if not base:
        return {}
    if not 1 <= base <= 65535 - (nodes + 1):
        raise InvalidArgument(f"metrics_port_base={base}: base..base+{nodes + 1} must be ports (1..65535)")
    return {"predictor": base, "scheduler": base + 1, **{f"node-{i}": base + 2 + i for i in range(nodes)}}


class LocalCluster:
    def __init__(self, spec: ClusterSpec, run_dir: Path, environ: Mapping[str, str]) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self._environ = dict(environ)
        self._popens: dict[str, subprocess.Popen] = {}
        self._metrics_ports: dict[str, int] = {}
        self.services: list[ServiceProcess] = []
        self.certs: CertBundle | None = None
        self._spawner: futures.ThreadPoolExecutor | None = None  # starts nodes added later (module docstring)
        self._nodes_started = 0  # node ids are never reused: the next is node-<this>

    @property
    def admin_tls(self) -> TlsMaterial | None:
        """What a client of this cluster presents (None: plaintext cluster)."""
        return self.certs.admin.load() if self.certs is not None else None

    @property
    def scheduler_address(self) -> str:
        return self._by_kind("scheduler")[0].address

    def scheduler_addresses(self) -> dict[str, str]:
        """Each scheduler replica's address by name (one entry without replicas)."""
        return {s.name: s.address for s in self._by_kind("scheduler")}

    @property
    def etcd_endpoint(self) -> str:
        """http://HOST:PORT of the cluster's etcd (https:// with TLS); empty without replicas."""
        found = self._by_kind("etcd")
        return f"{'https' if self.certs is not None else 'http'}://{found[0].address}" if found else ""

    @property
    def etcd_tls(self) -> EtcdTls | None:
        """What a client of this cluster's etcd presents (None: plaintext): the admin's certificate."""
        if self.certs is None:
            return None
        return EtcdTls(self.certs.ca.as_posix(), self.certs.admin.cert, self.certs.admin.key)

    @property
    def predictor_address(self) -> str:
        return self._by_kind("predictor")[0].address

    def node_addresses(self) -> dict[str, str]:
        return {s.name: s.address for s in self._by_kind("kvstore")}

    def _by_kind(self, kind: str) -> list[ServiceProcess]:
        return [s for s in self.services if s.kind == kind]

    def start(self, timeout_s: float = 60.0) -> list[ServiceProcess]:
        """Starts every service and returns once all are SERVING and every
        node has registered with the scheduler; stops all on failure."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics_ports = metrics_ports(self.spec.metrics_port_base, self.spec.nodes)
        deadline = time.monotonic() + timeout_s
        if self.spec.tls:
            self.certs = make_bundle(self.run_dir / "tls", [f"node-{i}" for i in range(self.spec.nodes)],
                                     hosts=[self.spec.host])
        admin = self.admin_tls
        try:
            predictor = self._spawn("predictor", "predictor", [], deadline)
            self._spawn_schedulers(["--predictor", predictor.address, "--policy", self.spec.policy], deadline)
            for i in range(self.spec.nodes):
                self._spawn(f"node-{i}", "kvstore", self._node_args(f"node-{i}"), deadline)
            self._nodes_started = self.spec.nodes
            for service in self.services:
                if service.kind != "etcd":
                    wait_serving(service.address, deadline, admin)
            for address in self.scheduler_addresses().values():
                wait_nodes_registered(address, self.spec.nodes, deadline, admin)
        except BaseException:
            self.stop()
            raise
        self._spawner = futures.ThreadPoolExecutor(1, thread_name_prefix="cluster-spawner")
        self._write_state()
        return self.services

    def _spawn_schedulers(self, args: list[str], deadline: float) -> None:
        """One scheduler, or spec.replicas of them on an etcd of their own (module docstring)."""
        if self.spec.replicas <= 1:
            self._spawn("scheduler", "scheduler", args, deadline)
            return
        etcd_args, etcd_flags, context = ["--data-dir", str(self.run_dir / "etcd-data")], [], None
        if self.certs is not None:  # etcd serves https to schedulers with the cluster's certificates only
            etcd_args += _tls_flags(self.certs.etcd)
            scheduler = self.certs.service("scheduler")
            etcd_flags = ["--etcd-ca", scheduler.ca, "--etcd-cert", scheduler.cert, "--etcd-key", scheduler.key]
            context = client_context(self.certs.admin.ca, self.certs.admin.cert, self.certs.admin.key)
        self._spawn("etcd", "etcd", etcd_args, deadline)
        wait_healthy(self.etcd_endpoint, deadline, context)
        names = [f"scheduler-{i}" for i in range(self.spec.replicas)]
        ports = dict(zip(names, free_ports(len(names), self.spec.host)))
        for name in names:
            peers = ",".join(f"{self.spec.host}:{ports[other]}" for other in names if other != name)
            self._spawn(name, "scheduler", [*args, "--etcd", self.etcd_endpoint, *etcd_flags, "--replica-id", name,
                                            "--peers", peers], deadline, port=ports[name])

    def kill_scheduler(self, name: str) -> ServiceProcess:
        """SIGKILL to one scheduler replica (a crash, for failover drills); returns what it was."""
        found = [s for s in self._by_kind("scheduler") if s.name == name]
        if not found or name not in self._popens:
            raise NotFound(f"no running scheduler {name!r}; running: {', '.join(self.scheduler_addresses())}")
        popen = self._popens[name]
        popen.kill()
        popen.wait()
        self._forget(name)
        return found[0]

    def _node_args(self, name: str) -> list[str]:
        schedulers = ",".join(self.scheduler_addresses().values())
        args = ["--node-id", name, "--scheduler", schedulers, "--geometry", self.spec.geometry,
                "--device-pages", str(self.spec.sizes.device_pages), "--host-pages", str(self.spec.sizes.host_pages)]
        if self.spec.block_size:
            args += ["--block-size", str(self.spec.block_size)]
        return args

    def add_node(self, timeout_s: float = 60.0) -> ServiceProcess:
        """Starts one more kvstore node, node-N with N the next id never
        used, and returns once it serves and the scheduler counts it alive."""
        if self._spawner is None:
            raise FailedPrecondition("the cluster is not running")
        return self._spawner.submit(self._add_node, timeout_s).result()

    def _add_node(self, timeout_s: float) -> ServiceProcess:
        deadline = time.monotonic() + timeout_s
        name = f"node-{self._nodes_started}"
        self._nodes_started += 1
        if self.certs is not None:
            self.certs = issue_node(self.certs, name, hosts=[self.spec.host])
        service = self._spawn(name, "kvstore", self._node_args(name), deadline)
        admin = self.admin_tls
        wait_serving(service.address, deadline, admin)
        wait_node_alive(self.scheduler_address, name, deadline, admin)
        self._write_state()
        return service

    def kill_node(self, name: str) -> ServiceProcess:
        """SIGKILL to a node's kvstore (a crash); returns what it was."""
        service, popen = self._node(name)
        popen.kill()
        popen.wait()
        self._forget(name)
        return service

    def remove_node(self, name: str, grace_s: float = 10.0) -> ServiceProcess:
        """SIGTERM to a node's kvstore, SIGKILL after grace_s; returns what it was."""
        service, popen = self._node(name)
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
        self._forget(name)
        return service

    def _node(self, name: str) -> tuple[ServiceProcess, subprocess.Popen]:
        found = [s for s in self._by_kind("kvstore") if s.name == name]
        if not found or name not in self._popens:
            raise NotFound(f"no running node {name!r}; running: {', '.join(self.node_addresses()) or 'none'}")
        return found[0], self._popens[name]

    def _forget(self, name: str) -> None:
        self._popens.pop(name, None)
        self.services = [s for s in self.services if s.name != name]
        self._write_state()

    def _spawn(self, name: str, kind: str, args: list[str], deadline: float, port: int = 0) -> ServiceProcess:
        log_path = self.run_dir / f"{name}.log"
        # Always explicit: a SPECKV_METRICS_PORT in the launcher's environment
        # would give every child the same port.
        metrics_port = self._metrics_ports.get(name, 0)
        command = [sys.executable, "-m", "speckv.services.cli", kind, "--host", self.spec.host, "--port", str(port),
                   "--metrics-port", str(metrics_port), *args, *self.spec.extra_args.get(kind, ())]
        env = child_environ({k: v for k, v in self._environ.items() if k not in _TLS_VARIABLES}
                            | {"PYTHONUNBUFFERED": "1"})
        if self.certs is not None and kind != "etcd":
            files = self.certs.node(name) if kind == "kvstore" else self.certs.service(kind)
            command += _tls_flags(files)
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env)
        self._popens[name] = popen
        address = _await_address(log_path, popen, name, deadline)
        metrics_address = f"{self.spec.host}:{metrics_port}" if metrics_port else ""
        service = ServiceProcess(name, kind, address, popen.pid, str(log_path), metrics_address)
        self.services.append(service)
        return service

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to all (nodes first, etcd last: the replicas' leases outlive them), wait up to grace_s,
        then SIGKILL."""
        order = sorted(self._popens.items(), key=lambda item: (not item[0].startswith("node-"), item[0] == "etcd"))
        for _, popen in order:
            if popen.poll() is None:
                popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, popen in order:
            try:
                popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        self._popens.clear()
        if self._spawner is not None:
            self._spawner.shutdown(wait=True)
            self._spawner = None
        (self.run_dir / "cluster.json").unlink(missing_ok=True)

    def _write_state(self) -> None:
        state = {"scheduler": self.scheduler_address, "schedulers": list(self.scheduler_addresses().values()),
                 "services": [asdict(s) for s in self.services]}
        if self.certs is not None:
            state["admin_tls"] = asdict(self.certs.admin)
        (self.run_dir / "cluster.json").write_text(json.dumps(state, indent=2))

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_TLS_VARIABLES = ("SPECKV_TLS_CERT", "SPECKV_TLS_KEY", "SPECKV_TLS_CA")


def _tls_flags(files: TlsFiles) -> list[str]:
    return ["--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca]


def _await_address(log_path: Path, popen: subprocess.Popen, name: str, deadline: float) -> str:
    while time.monotonic() < deadline:
        match = _LISTENING.search(log_path.read_text(errors="replace"))
        if match:
            return match.group(1)
        if popen.poll() is not None:
            raise Unavailable(f"{name} exited with code {popen.returncode} before serving; "
                              f"its log {log_path} ends:\n{_tail(log_path)}")
        time.sleep(0.05)
    raise Unavailable(f"{name} did not start in time; its log {log_path} ends:\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_serving(address: str, deadline: float, tls: TlsMaterial | None = None) -> None:
    """Polls the standard gRPC health service until it says SERVING."""
    with dial(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise Unavailable(f"{address} is not SERVING")
            time.sleep(0.1)


def wait_node_alive(scheduler_address: str, node_id: str, deadline: float, tls: TlsMaterial | None = None) -> None:
    with dial(scheduler_address, tls, "scheduler") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        while True:
            state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=2.0)
            if any(n.node_id == node_id and n.alive for n in state.nodes):
                return
            if time.monotonic() > deadline:
                raise Unavailable(f"node {node_id} did not register with the scheduler in time")
            time.sleep(0.1)


def wait_nodes_registered(scheduler_address: str, nodes: int, deadline: float,
                          tls: TlsMaterial | None = None) -> None:
    with dial(scheduler_address, tls, "scheduler") as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        while True:
            state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=2.0)
            if sum(1 for n in state.nodes if n.alive) >= nodes:
                return
            if time.monotonic() > deadline:
                raise Unavailable(f"only {len(state.nodes)} of {nodes} nodes registered with the scheduler")
            time.sleep(0.1)
