"""kvstore processes on loopback for the transfer benchmark (and the tests
that need real separate processes): `python -m speckv.services.cli kvstore`
on port 0, its address read from the "listening on" line it prints.

Children die with their parent (PR_SET_PDEATHSIG), log to a file, and are
stopped with SIGTERM, then SIGKILL after a grace period. A log directory
start_kvstore made itself is removed by stop() (one per process: the tests
start hundreds); a caller's log_dir is left as it is.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import grpc

from speckv.services.cluster.parent_death import child_environ
from speckv.v1 import kvstore_pb2_grpc

_LISTENING = re.compile(r"listening on (\S+:\d+)")



@dataclass(slots=True)
class KVStoreProcess:
    node_id: str
    popen: subprocess.Popen
    address: str
    log_path: Path
    owned_dir: Path | None = None  # made by start_kvstore: stop() removes it
    channel: grpc.Channel = field(init=False)
    stub: kvstore_pb2_grpc.KVStoreStub = field(init=False)

    def __post_init__(self) -> None:
        options = [("grpc.max_send_message_length", 256 << 20), ("grpc.max_receive_message_length", 256 << 20),
                   ("grpc.http2.bdp_probe", 0)]
        self.channel = grpc.insecure_channel(self.address, options=options)
        self.stub = kvstore_pb2_grpc.KVStoreStub(self.channel)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, sockets are reset by the kernel."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self, grace_s: float = 10.0) -> None:
        self.channel.close()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)
        if self.owned_dir is not None:
            shutil.rmtree(self.owned_dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_kvstore(node_id: str, args: Sequence[str] = (), *, environ: Mapping[str, str] | None = None,
                  log_dir: Path | None = None, timeout_s: float = 60.0) -> KVStoreProcess:
    """A kvstore process listening on 127.0.0.1:<free port>."""
    owned_dir = None
    if log_dir is None:
        log_dir = owned_dir = Path(tempfile.mkdtemp(prefix="speckv-kvstore-"))
    log_path = log_dir / f"{node_id}.log"
    # The child asks for its parent-death signal itself (services/cluster/parent_death.py): nothing runs between fork and exec.
    env = child_environ({**os.environ, **(environ or {}), "PYTHONUNBUFFERED": "1"})
    env.setdefault("SPECKV_LOG_LEVEL", "WARNING")
    argv = [sys.executable, "-m", "speckv.services.cli", "kvstore", "--node-id", node_id, "--host", "127.0.0.1",
            "--port", "0", *args]
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env)
    address = read_address(popen, timeout_s)
    if address is None:
        popen.kill()
        popen.wait(timeout=30)
        tail = log_path.read_text(errors="replace")[-2000:]
        if owned_dir is not None:
            shutil.rmtree(owned_dir, ignore_errors=True)
        raise RuntimeError(f"kvstore {node_id} did not start: {tail}")
    return KVStoreProcess(node_id, popen, address, log_path, owned_dir)


def read_address(popen: subprocess.Popen, timeout_s: float) -> str | None:
    found: list[str] = []

    def read() -> None:
        assert popen.stdout is not None
        for raw in popen.stdout:
            match = _LISTENING.search(raw.decode(errors="replace"))
            if match:
                found.append(match.group(1))
                break
        # Keep draining so the child never blocks on a full stdout pipe.
        for _ in popen.stdout:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    waited = threading.Event()
    for _ in range(int(timeout_s / 0.05)):
        if found or popen.poll() is not None:
            break
        waited.wait(0.05)
    return found[0] if found else None
