"""A real etcd for the tests that need one: `running_etcd(data_dir)` starts
the `etcd` binary (Debian's etcd-server package; `make test` installs it:
Makefile ETCD_STAMP) as a one-member cluster on free loopback ports with its
data in data_dir, waits until /health answers, yields it, and kills it.
`running_etcd_cluster(data_dir, members=3)` does the same for a cluster of
several members (EtcdCluster: each member, and every client URL), and
`tls=ServerTls(...)` serves https and refuses clients without a certificate.
Both run the command `speckv etcd` runs (etcd_process.etcd_command).

Fixtures: `etcd_server` (one etcd per test module; tests keep apart by using
their own cluster name, i.e. key prefix) and `fresh_etcd` (one per test).
A test file uses them by importing them: `from tests.support.etcd import
etcd_server`. Without the binary they skip, saying so; nothing else skips.
"""
from __future__ import annotations

import contextlib
import shutil
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from speckv.services.cluster.etcd_process import ServerTls, client_context, etcd_command, healthy
from speckv.services.cluster.ports import free_ports

START_TIMEOUT_S = 30.0  # generous: two shared cores; etcd needs well under a second when idle
MISSING = ("the etcd binary is not on PATH: `make test` installs Debian's etcd-server "
           "(apt-get install --no-install-recommends etcd-server)")


@dataclass(frozen=True, slots=True)
class EtcdServer:
    endpoint: str  # http[s]://127.0.0.1:PORT, the client URL
    process: subprocess.Popen
    data_dir: Path

    def kill(self) -> None:
        """kill -9: the member dies without a word (its leases lapse on no one's watch)."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait(timeout=10)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass(frozen=True, slots=True)
class EtcdCluster:
    members: tuple[EtcdServer, ...]

    @property
    def endpoints(self) -> str:
        """Every member's client URL, comma-separated (what --etcd takes)."""
        return ",".join(m.endpoint for m in self.members)


def etcd_binary() -> str | None:
    return shutil.which("etcd")


@contextlib.contextmanager
def running_etcd(data_dir: Path, tls: ServerTls | None = None) -> Iterator[EtcdServer]:
    with running_etcd_cluster(data_dir, 1, tls) as cluster:
        yield cluster.members[0]


@contextlib.contextmanager
def running_etcd_cluster(data_dir: Path, members: int = 3, tls: ServerTls | None = None) -> Iterator[EtcdCluster]:
    """members etcd processes forming one cluster on loopback; all killed on exit."""
    binary = etcd_binary()
    if binary is None:
        pytest.skip(MISSING)
    ports = free_ports(2 * members)
    token = f"speckv-test-{uuid.uuid4().hex[:8]}"
    names = [f"{token}-{i}" for i in range(members)]
    initial = ",".join(f"{name}=http://127.0.0.1:{ports[2 * i + 1]}" for i, name in enumerate(names))
    data_dir.mkdir(parents=True, exist_ok=True)
    started: list[EtcdServer] = []
    logs = []
    try:
        for i, name in enumerate(names):
            member_dir = data_dir / f"member-{i}"
            member_dir.mkdir(parents=True, exist_ok=True)
            log = (member_dir / "etcd.log").open("wb")
            logs.append(log)
            # The command `speckv etcd` runs (auto-compaction included), on this test's own ports and names.
            args = etcd_command(binary, name, member_dir / "data", "127.0.0.1", ports[2 * i], ports[2 * i + 1],
                                initial_cluster=initial if members > 1 else "", token=token, tls=tls)
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            scheme = "https" if tls is not None else "http"
            started.append(EtcdServer(f"{scheme}://127.0.0.1:{ports[2 * i]}", process, member_dir))
        context = client_context(tls.ca, tls.cert, tls.key) if tls is not None else None
        for server in started:  # a member of several is healthy once the cluster has a leader
            _wait_healthy(server, context)
        yield EtcdCluster(tuple(started))
    finally:
        for server in started:
            server.kill()
        for log in logs:
            log.close()


def _wait_healthy(server: EtcdServer, context: ssl.SSLContext | None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not healthy(server.endpoint, context):
        if server.process.poll() is not None:
            raise RuntimeError(f"etcd exited with {server.process.returncode} at start: "
                               f"{(server.data_dir / 'etcd.log').read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"etcd at {server.endpoint} not healthy after {START_TIMEOUT_S} s")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory) -> Iterator[EtcdServer]:
    with running_etcd(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
def fresh_etcd(tmp_path) -> Iterator[EtcdServer]:
    with running_etcd(tmp_path / "etcd") as server:
        yield server


@pytest.fixture
def etcd_cluster(tmp_path) -> Iterator[EtcdCluster]:
    """Three members on loopback, one test's."""
    with running_etcd_cluster(tmp_path / "etcd", 3) as cluster:
        yield cluster
