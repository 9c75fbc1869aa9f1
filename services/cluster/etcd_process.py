"""`speckv etcd`: a one-member etcd for a local cluster of scheduler replicas.

Runs the `etcd` binary (Debian's etcd-server package, which `make` installs:
Makefile ETCD_STAMP) with its data in --data-dir, its client URL on
--host:--port and its peer URL on --peer-port (0: a free port each). It
prints `etcd listening on HOST:PORT` and then *becomes* etcd (execv), so the
parent-death signal `speckv`'s entry point asked for (parent_death.py) stays
with it: the local cluster's etcd dies with its launcher like every service.

One member is a development etcd: production runs three or five members of
its own (docs/replicas.md); the scheduler replicas take any endpoint list.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence

from speckv.services.cluster.ports import free_ports
from speckv.services.common.errors import FailedPrecondition, Unavailable

MISSING = ("the etcd binary is not on PATH: `make` installs Debian's etcd-server "
           "(apt-get install --no-install-recommends etcd-server)")


def etcd_binary() -> str:
    binary = shutil.which("etcd")
    if binary is None:
        raise FailedPrecondition(MISSING)
    return binary


def etcd_command(binary: str, name: str, data_dir: Path, host: str, client_port: int, peer_port: int) -> list[str]:
    """The etcd command line of a one-member cluster named `name`."""
    client, peer = f"http://{host}:{client_port}", f"http://{host}:{peer_port}"
    return [binary, "--name", name, "--data-dir", str(data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{name}={peer}", "--initial-cluster-state", "new", "--initial-cluster-token", name,
            # Every order transition is a revision: keep the last 10,000 (docs/replicas.md).
            "--auto-compaction-mode", "revision", "--auto-compaction-retention", "10000",
            "--logger", "zap", "--log-level", "warn"]


def healthy(endpoint: str) -> bool:
    """etcd's own /health says true."""
    try:
        with urllib.request.urlopen(f"{endpoint}/health", timeout=1.0) as reply:
            return json.loads(reply.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


def wait_healthy(endpoint: str, deadline: float) -> None:
    while not healthy(endpoint):
        if time.monotonic() > deadline:
            raise Unavailable(f"etcd at {endpoint} is not healthy")
        time.sleep(0.1)


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    parser = argparse.ArgumentParser(prog="speckv etcd", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="etcd's data (created if missing)")
    parser.add_argument("--name", default="speckv-etcd", help="the member's name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=2379, help="client port (0: a free one)")
    parser.add_argument("--peer-port", type=int, default=0, help="peer port (0: a free one)")
    parser.add_argument("--metrics-port", type=int, default=0, help="ignored (the launcher passes it to every service)")
    args = parser.parse_args(list(argv))
    binary = etcd_binary()
    ports = free_ports(2, args.host)
    client_port, peer_port = args.port or ports[0], args.peer_port or ports[1]
    args.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    print(f"etcd listening on {args.host}:{client_port}", flush=True)
    sys.stdout.flush()
    os.execv(binary, etcd_command(binary, args.name, args.data_dir, args.host, client_port, peer_port))
    return 0  # not reached
