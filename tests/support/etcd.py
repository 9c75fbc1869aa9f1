"""A real etcd for the tests that need one: `running_etcd(data_dir)` starts
the `etcd` binary (Debian's etcd-server package; `make test` installs it:
Makefile ETCD_STAMP) as a one-member cluster on free loopback ports with its
data in data_dir, waits until /health answers, yields it, and kills it.

Fixtures: `etcd_server` (one etcd per test module; tests keep apart by using
their own cluster name, i.e. key prefix) and `fresh_etcd` (one per test).
A test file uses them by importing them: `from tests.support.etcd import
etcd_server`. Without the binary they skip, saying so; nothing else skips.
"""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from speckv.services.cluster.etcd_process import etcd_command, healthy
from speckv.services.cluster.ports import free_ports

START_TIMEOUT_S = 30.0  # generous: two shared cores; etcd needs well under a second when idle
MISSING = ("the etcd binary is not on PATH: `make test` installs Debian's etcd-server "
           "(apt-get install --no-install-recommends etcd-server)")


@dataclass(frozen=True, slots=True)
class EtcdServer:
    endpoint: str  # http://127.0.0.1:PORT, the client URL
    process: subprocess.Popen
    data_dir: Path

    def kill(self) -> None:
        """kill -9: the member dies without a word (its leases lapse on no one's watch)."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait(timeout=10)


def etcd_binary() -> str | None:
    return shutil.which("etcd")


@contextlib.contextmanager
def running_etcd(data_dir: Path) -> Iterator[EtcdServer]:
    binary = etcd_binary()
    if binary is None:
        pytest.skip(MISSING)
    client_port, peer_port = free_ports(2)
    client = f"http://127.0.0.1:{client_port}"
    name = f"speckv-test-{uuid.uuid4().hex[:8]}"
    data_dir.mkdir(parents=True, exist_ok=True)
    log = (data_dir / "etcd.log").open("wb")
    # The command `speckv etcd` runs (auto-compaction included), on this test's own ports and name.
    args = etcd_command(binary, name, data_dir / "member-data", "127.0.0.1", client_port, peer_port)
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    server = EtcdServer(client, process, data_dir)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not healthy(client):
            if process.poll() is not None:
                raise RuntimeError(f"etcd exited with {process.returncode} at start: "
                                   f"{(data_dir / 'etcd.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd at {client} not healthy after {START_TIMEOUT_S} s")
            time.sleep(0.05)
        yield server
    finally:
        server.kill()
        log.close()


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory) -> Iterator[EtcdServer]:
    with running_etcd(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
def fresh_etcd(tmp_path) -> Iterator[EtcdServer]:
    with running_etcd(tmp_path / "etcd") as server:
        yield server
