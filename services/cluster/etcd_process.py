"""`speckv etcd`: a one-member etcd for a local cluster of scheduler replicas.

Runs the `etcd` binary (Debian's etcd-server package, which `make` installs:
Makefile ETCD_STAMP) with its data in --data-dir, its client URL on
--host:--port and its peer URL on --peer-port (0: a free port each). It
prints `etcd listening on HOST:PORT` and then *becomes* etcd (execv), so the
parent-death signal `speckv`'s entry point asked for (parent_death.py) stays
with it: the local cluster's etcd dies with its launcher like every service.
With --tls-cert/--tls-key/--tls-ca it serves https and
refuses a client without a certificate the CA signed (docs/security.md).

One member is a development etcd: production runs three or five members of
its own (docs/replicas.md); the scheduler replicas take any endpoint list.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import sys
import time
import urllib.request
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class ServerTls:
    """etcd serving TLS to its clients: its certificate and key (both server
    and client auth: etcd's gRPC gateway dials etcd itself with them), and
    the CA whose certificates it accepts from clients (--client-cert-auth:
    a client without one is refused)."""

    cert: str
    key: str
    ca: str


def etcd_command(binary: str, name: str, data_dir: Path, host: str, client_port: int, peer_port: int, *,
                 initial_cluster: str = "", token: str = "", tls: ServerTls | None = None) -> list[str]:
    """The etcd command line of member `name`: of a one-member cluster by
    default; of a larger one with initial_cluster ("name=http://host:peer,..."
    naming every member, this one included) and the members' common token.
    tls: client URLs are https and need a client certificate (peers stay
    http: loopback or a private network, docs/replicas.md)."""
    scheme = "https" if tls is not None else "http"
    client, peer = f"{scheme}://{host}:{client_port}", f"http://{host}:{peer_port}"
    command = [binary, "--name", name, "--data-dir", str(data_dir),
               "--listen-client-urls", client, "--advertise-client-urls", client,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", initial_cluster or f"{name}={peer}", "--initial-cluster-state", "new",
               "--initial-cluster-token", token or name,
               # Every order transition is a revision: keep the last 10,000 (docs/replicas.md).
               "--auto-compaction-mode", "revision", "--auto-compaction-retention", "10000",
               "--logger", "zap", "--log-level", "warn"]
    if tls is not None:
        command += ["--cert-file", tls.cert, "--key-file", tls.key, "--trusted-ca-file", tls.ca,
                    "--client-cert-auth"]
    return command


def client_context(ca: str, cert: str = "", key: str = "") -> ssl.SSLContext:
    """What a client of a TLS etcd presents: ca checks etcd's certificate, cert and key prove the client."""
    context = ssl.create_default_context(cafile=ca)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def healthy(endpoint: str, context: ssl.SSLContext | None = None) -> bool:
    """etcd's own /health says true (an https endpoint: with context)."""
    try:
        with urllib.request.urlopen(f"{endpoint}/health", timeout=1.0, context=context) as reply:
            return json.loads(reply.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


def wait_healthy(endpoint: str, deadline: float, context: ssl.SSLContext | None = None) -> None:
    while not healthy(endpoint, context):
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
    parser.add_argument("--tls-cert", default="",
                        help="serve https with this certificate (PEM; `speckv certs` writes etcd/cert.pem)")
    parser.add_argument("--tls-key", default="", help="the key of --tls-cert (PEM)")
    parser.add_argument("--tls-ca", default="",
                        help="accept only clients with a certificate this CA signed (PEM)")
    args = parser.parse_args(list(argv))
    given = [args.tls_cert, args.tls_key, args.tls_ca]
    if any(given) and not all(given):
        parser.error("--tls-cert, --tls-key and --tls-ca go together (TLS needs all three)")
    tls = ServerTls(args.tls_cert, args.tls_key, args.tls_ca) if all(given) else None
    binary = etcd_binary()
    ports = free_ports(2, args.host)
    client_port, peer_port = args.port or ports[0], args.peer_port or ports[1]
    args.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    print(f"etcd listening on {args.host}:{client_port}", flush=True)
    sys.stdout.flush()
    os.execv(binary, etcd_command(binary, args.name, args.data_dir, args.host, client_port, peer_port, tls=tls))
    return 0  # not reached
