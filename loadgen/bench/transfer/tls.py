"""The other design of the data plane's protection, measured as a prototype
(docs/security.md): mutual TLS on the data connection itself, each end
checking the other's node certificate. The same raw loopback link as the
tuned socket ceiling (ceilings.SocketCeiling: a spawned receiver,
1 MiB sendall of a reused buffer, the data plane's socket options), wrapped
in Python's ssl (OpenSSL, TLS 1.3, certificates from a throwaway
`speckv certs` bundle). The real data plane could not beat it: it is the
ceiling of a TLS data plane in Python, as the plain socket is of today's.

Python's SSLSocket has no sendmsg / recvmsg_into, so the zero-copy gather
and scatter of the plain data plane would be lost too; that is not counted
here (the ceiling is generous to TLS).
"""
from __future__ import annotations

import multiprocessing as mp
import socket
import ssl
import tempfile
from pathlib import Path

import numpy as np

from speckv.loadgen.bench.transfer.ceilings import best_rate
from speckv.services.cluster.certs import make_bundle
from speckv.services.kvstore.dataplane.listener import tune

MIB = 1 << 20
NODES = ("bench-sender", "bench-receiver")


def _context(bundle: Path, node: str, server: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(bundle / "node" / node / "cert.pem", bundle / "node" / node / "key.pem")
    context.load_verify_locations(bundle / "ca.pem")
    context.verify_mode = ssl.CERT_REQUIRED  # mutual: the receiver checks the sender's node certificate
    if not server:
        context.check_hostname = False  # the node identity is in the URI SAN; the CA check is what is timed
    return context


def _recv_exact(conn: ssl.SSLSocket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:], len(view) - got)
        if n == 0:
            return False
        got += n
    return True


def _receiver(port_queue: "mp.Queue[int]", bundle: str, chunk: int) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port_queue.put(listener.getsockname()[1])
    raw, _ = listener.accept()
    tune(raw)
    conn = _context(Path(bundle), NODES[1], server=True).wrap_socket(raw, server_side=True)
    view = memoryview(bytearray(chunk))
    header = memoryview(bytearray(8))
    while _recv_exact(conn, header):
        remaining = int.from_bytes(header, "little")
        while remaining:
            n = conn.recv_into(view, min(chunk, remaining))
            if n == 0:
                return
            remaining -= n
        conn.sendall(b"k")


def tls_socket_gbps(nbytes: int, repeats: int, chunk: int = MIB) -> float:
    """Best of repeats passes of nbytes over one mutual-TLS loopback link, GB/s."""
    with tempfile.TemporaryDirectory(prefix="speckv-bench-tls-") as tmp:
        make_bundle(Path(tmp), NODES)
        context = mp.get_context("spawn")
        ports: mp.Queue[int] = context.Queue()
        child = context.Process(target=_receiver, args=(ports, tmp, chunk), daemon=True)
        child.start()
        try:
            raw = socket.create_connection(("127.0.0.1", ports.get(timeout=60)))
            tune(raw)
            sock = _context(Path(tmp), NODES[0], server=False).wrap_socket(raw)
            payload = memoryview(np.ones(chunk, dtype=np.uint8)).cast("B")
            total = nbytes // chunk * chunk

            def one_pass() -> None:
                sock.sendall(total.to_bytes(8, "little"))
                for _ in range(total // chunk):
                    sock.sendall(payload)
                _recv_exact(sock, memoryview(bytearray(1)))

            try:
                return best_rate(total, one_pass, repeats)
            finally:
                sock.close()
        finally:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
