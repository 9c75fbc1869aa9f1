"""The cluster `speckv bench chaos` attacks: real `speckv` processes on
loopback with mutual TLS (a throwaway bundle, as `speckv up --tls`), which
the suite can kill -9 and restart on the same port, stop and continue
(SIGSTOP: a slow peer), and cut off (a partition).

Not services/cluster/launcher.LocalCluster: the suite needs per-node flags
(the partitioned node talks through forwarders), restarts on the same port
(peers keep the address they know) and a scheduler --state-dir; the
launcher's helpers (wait_serving, wait_nodes_registered) are reused.

The partitioned node reaches the scheduler, and is reached by it, only
through two TCP forwarders of the suite (its --scheduler and its
--advertise-address). A partition drops their packets with an nftables rule
when the suite runs in a private network namespace (chaos.py re-executes
itself under `unshare --net` where the machine allows, so no rule can touch
anyone else's traffic); elsewhere the forwarders stall instead: they stop
moving bytes and accept without connecting on, as a black-holed link looks
to both ends.
"""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import grpc

from speckv.services.cluster.launcher import wait_nodes_registered, wait_serving
from speckv.services.cluster.certs import CertBundle, make_bundle
from speckv.services.common.errors import Unavailable
from speckv.services.cluster.parent_death import child_environ
from speckv.services.common.rpc.tls import TlsFiles, TlsMaterial, dial
from speckv.v1 import kvstore_pb2_grpc, predictor_pb2_grpc, scheduler_pb2_grpc

HOST = "127.0.0.1"
NETNS_ENV = "SPECKV_CHAOS_NETNS"  # set by chaos.py in the child it runs inside a private network namespace
_LISTENING = re.compile(r"listening on (\S+:\d+)")
_TLS_VARIABLES = ("SPECKV_TLS_CERT", "SPECKV_TLS_KEY", "SPECKV_TLS_CA")
_NFT_TABLE = "speckv_chaos"


@dataclass(slots=True)
class Service:
    """One service process; port stays fixed across restarts."""

    name: str
    kind: str
    args: list[str]
    log_path: Path
    tls: TlsFiles
    port: int = 0
    popen: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen is not None else 0

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class Forwarder:
    """A TCP forwarder to target; stall() freezes every byte both ways and
    accepts new connections without connecting on, heal() resumes."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server((HOST, 0))
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name=f"forward-{self.port}").start()

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def stall(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._closed = True
        self._open.set()
        for sock in [self._listener, *self._sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._open.wait()  # a stalled link: the client's connect succeeded, nothing comes back
        try:
            upstream = socket.create_connection(self.target, timeout=5.0)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        self._sockets += [client, upstream]
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed:
                ready, _, _ = select.select([src], [], [], 0.2)
                if not ready:
                    continue
                self._open.wait()  # stalled: leave the bytes in the kernel's buffers
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def nft_usable(environ: Mapping[str, str]) -> bool:
    """nftables partitions only inside the suite's own network namespace."""
    if environ.get(NETNS_ENV) != "1" or shutil.which("nft") is None:
        return False
    probe = subprocess.run(["nft", "list", "tables"], capture_output=True, timeout=10)
    return probe.returncode == 0


class Partition:
    """Cuts the forwarded links of one node: nftables drops (private netns)
    or the forwarders stall (module docstring)."""

    def __init__(self, forwarders: list[Forwarder], use_nft: bool) -> None:
        self._forwarders = forwarders
        self.mechanism = "nftables drop in the suite's network namespace" if use_nft else "stalled TCP forwarders"
        self._nft = use_nft

    def cut(self) -> None:
        if not self._nft:
            for f in self._forwarders:
                f.stall()
            return
        ports = ", ".join(str(f.port) for f in self._forwarders)
        script = (f"add table inet {_NFT_TABLE}\n"
                  f"add chain inet {_NFT_TABLE} input {{ type filter hook input priority 0; }}\n"
                  f"add rule inet {_NFT_TABLE} input tcp dport {{ {ports} }} drop\n"
                  f"add rule inet {_NFT_TABLE} input tcp sport {{ {ports} }} drop\n")
        subprocess.run(["nft", "-f", "-"], input=script.encode(), check=True, capture_output=True, timeout=10)

    def heal(self) -> None:
        if not self._nft:
            for f in self._forwarders:
                f.heal()
            return
        subprocess.run(["nft", "delete", "table", "inet", _NFT_TABLE], capture_output=True, timeout=10)


@dataclass(slots=True)
class ChaosSpec:
    nodes: int = 3  # plus one partitionable node, node-<nodes>
    device_pages: int = 128
    node_timeout_s: float = 1.5  # short, so kills and partitions are seen within seconds
    heartbeat_interval_ms: int = 250
    data_read_timeout_s: float = 4.0
    pin_lease_s: float = 2.0
    extra: dict[str, list[str]] = field(default_factory=dict)  # service kind -> flags added to each of its kind
    node_extra: dict[str, list[str]] = field(default_factory=dict)  # node id -> flags for that kvstore alone


class ChaosCluster:
    """Predictor, scheduler (--state-dir) and spec.nodes + 1 kvstores, mutual TLS."""

    def __init__(self, spec: ChaosSpec, run_dir: Path, environ: Mapping[str, str]) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self._environ = {k: v for k, v in environ.items() if k not in _TLS_VARIABLES}
        self.services: dict[str, Service] = {}
        self.forwarders: list[Forwarder] = []
        self.certs: CertBundle | None = None
        self.partition: Partition | None = None
        self._channels: dict[tuple[str, str], grpc.Channel] = {}

    @property
    def node_names(self) -> list[str]:
        return [n for n, s in self.services.items() if s.kind == "kvstore"]

    @property
    def partitioned_node(self) -> str:
        return f"node-{self.spec.nodes}"

    def start(self, timeout_s: float = 90.0) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        nodes = [f"node-{i}" for i in range(self.spec.nodes + 1)]
        self.certs = make_bundle(self.run_dir / "tls", nodes, hosts=[HOST])
        deadline = time.monotonic() + timeout_s
        spec = self.spec
        predictor = self._add("predictor", "predictor", [], self.certs.service("predictor"))
        self._spawn(predictor, deadline)
        scheduler = self._add("scheduler", "scheduler", [
            "--predictor", predictor.address, "--state-dir", str(self.run_dir / "state"),
            "--node-timeout-s", str(spec.node_timeout_s), "--heartbeat-interval-ms", str(spec.heartbeat_interval_ms),
            "--tick-s", "0.1", "--engine-profile", "tiny"], self.certs.service("scheduler"))
        self._spawn(scheduler, deadline)
        for i, name in enumerate(nodes):
            args = ["--node-id", name, "--geometry", "tiny", "--device-pages", str(spec.device_pages),
                    "--data-read-timeout-s", str(spec.data_read_timeout_s), "--pin-lease-s", str(spec.pin_lease_s),
                    "--reservation-lease-s", "5", "--peer-timeout-s", "5", *spec.node_extra.get(name, ())]
            if name == self.partitioned_node:
                # Reserve the node's own port first, so its forwarder knows where to forward.
                port = _free_port()
                to_scheduler = Forwarder((HOST, scheduler.port))
                to_node = Forwarder((HOST, port))
                self.forwarders = [to_scheduler, to_node]
                args += ["--scheduler", to_scheduler.address, "--advertise-address", to_node.address]
                service = self._add(name, "kvstore", args, self.certs.node(name))
                service.port = port
            else:
                service = self._add(name, "kvstore", [*args, "--scheduler", scheduler.address], self.certs.node(name))
            self._spawn(service, deadline)
        admin = self.admin
        for service in self.services.values():
            wait_serving(service.address, deadline, admin)
        wait_nodes_registered(scheduler.address, len(nodes), deadline, admin)
        self.partition = Partition(self.forwarders, nft_usable(self._environ))

    def _add(self, name: str, kind: str, args: list[str], tls: TlsFiles) -> Service:
        service = Service(name, kind, [*args, *self.spec.extra.get(kind, ())], self.run_dir / f"{name}.log", tls)
        self.services[name] = service
        return service

    def _spawn(self, service: Service, deadline: float) -> None:
        command = [sys.executable, "-m", "speckv.services.cli", service.kind, "--host", HOST,
                   "--port", str(service.port), "--metrics-port", "0", *service.args,
                   "--tls-cert", service.tls.cert, "--tls-key", service.tls.key, "--tls-ca", service.tls.ca]
        offset = service.log_path.stat().st_size if service.log_path.exists() else 0
        with open(service.log_path, "ab") as log:
            service.popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             # no preexec_fn: forking with gRPC threads running must not run
                                             # Python in the child; it asks for its parent-death signal itself
                                             env=child_environ({**self._environ, "PYTHONUNBUFFERED": "1"}))
        while time.monotonic() < deadline:
            with open(service.log_path, "rb") as log:
                log.seek(offset)
                match = _LISTENING.search(log.read().decode(errors="replace"))
            if match:
                service.port = int(match.group(1).rsplit(":", 1)[1])
                return
            if service.popen.poll() is not None:
                raise Unavailable(f"{service.name} exited with {service.popen.returncode}; see {service.log_path}")
            time.sleep(0.05)
        raise Unavailable(f"{service.name} did not start in time; see {service.log_path}")

    # --- faults ---------------------------------------------------------
    def kill9(self, name: str) -> int:
        """SIGKILL; returns the exit status (-9)."""
        service = self.services[name]
        assert service.popen is not None
        service.popen.send_signal(signal.SIGKILL)
        return service.popen.wait(timeout=30)

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        """Starts a killed service again on its port, and waits until it serves."""
        service = self.services[name]
        deadline = time.monotonic() + timeout_s
        while True:  # the port may linger a moment after a kill
            try:
                self._spawn(service, deadline)
                break
            except Unavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        wait_serving(service.address, deadline, self.admin)

    def pause(self, name: str) -> None:
        os.kill(self.services[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.kill(self.services[name].pid, signal.SIGCONT)

    def rss_bytes(self, name: str) -> int:
        """The process's resident memory, from /proc."""
        for line in Path(f"/proc/{self.services[name].pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    # --- clients --------------------------------------------------------
    @property
    def admin(self) -> TlsMaterial:
        assert self.certs is not None
        return self.certs.admin.load()

    def identity(self, who: str) -> TlsMaterial:
        """admin, a node id, or a service name."""
        assert self.certs is not None
        if who == "admin":
            return self.admin
        if who.startswith("node-"):
            return self.certs.node(who).load()
        return self.certs.service(who).load()

    def channel(self, name: str, who: str = "admin") -> grpc.Channel:
        """A cached channel to a service as an identity."""
        key = (name, who)
        if key not in self._channels:
            service = self.services[name]
            role = "kvstore" if service.kind == "kvstore" else service.kind
            self._channels[key] = dial(service.address, self.identity(who), role)
        return self._channels[key]

    def scheduler(self, who: str = "admin") -> scheduler_pb2_grpc.SchedulerStub:
        return scheduler_pb2_grpc.SchedulerStub(self.channel("scheduler", who))

    def kvstore(self, name: str, who: str = "admin") -> kvstore_pb2_grpc.KVStoreStub:
        return kvstore_pb2_grpc.KVStoreStub(self.channel(name, who))

    def predictor(self, who: str = "admin") -> predictor_pb2_grpc.PredictorStub:
        return predictor_pb2_grpc.PredictorStub(self.channel("predictor", who))

    def drop_channels(self, name: str) -> None:
        """Closes the cached channels to a restarted service (a fresh connection each)."""
        for key in [k for k in self._channels if k[0] == name]:
            self._channels.pop(key).close()

    def stop(self, grace_s: float = 10.0) -> None:
        if self.partition is not None:
            self.partition.heal()
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        live = [s for s in self.services.values() if s.alive()]
        for service in live:
            assert service.popen is not None
            try:
                os.kill(service.pid, signal.SIGCONT)  # a paused one cannot handle SIGTERM
            except ProcessLookupError:
                pass
            service.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for service in live:
            assert service.popen is not None
            try:
                service.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                service.popen.kill()
                service.popen.wait()
        for forwarder in self.forwarders:
            forwarder.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]
