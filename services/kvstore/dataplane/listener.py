"""The target's TCP data plane listener: accepts connections on the data port
and serves each on its own thread (services/kvstore/dataplane/receiver.py does the
frames). Not core: it owns sockets and threads.

Sockets get TCP_NODELAY (a chunk's header must not wait for Nagle) and large
kernel buffers so the sender can run a chunk or two ahead of the receiver's
copy into the pool.
"""
from __future__ import annotations

import logging
import socket
import threading

from speckv.services.common.errors import InvalidArgument
from speckv.services.kvstore.dataplane.receiver import ChunkSink, StagingBuffers, serve_connection

log = logging.getLogger(__name__)
SOCKET_BUFFER_BYTES = 8 * 1024 * 1024


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)


class DataPlaneServer:
    """Binds at construction (so the port is known before start)."""

    def __init__(self, sink: ChunkSink, host: str, port: int, name: str = "kvstore") -> None:
        self._sink = sink
        self._name = name
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, port))
        except OSError as exc:
            self._listener.close()
            raise InvalidArgument(f"data_port={port}: cannot bind {host}:{port}: {exc}") from None
        self._listener.listen(64)
        self.host, self.port = self._listener.getsockname()[:2]
        self._staging = StagingBuffers()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"{name}-data-accept", daemon=True)

    def address(self, advertise_host: str = "") -> str:
        return f"{advertise_host or self.host}:{self.port}"

    def start(self) -> "DataPlaneServer":
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Stops accepting and breaks open connections (their reservations are
        aborted by their threads)."""
        self._stopping.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for conn in list(self._connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._acceptor.is_alive():
            self._acceptor.join(timeout=2.0)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # listener closed
            tune(conn)
            with self._lock:
                self._connections.add(conn)
            threading.Thread(target=self._serve, args=(conn, f"{peer[0]}:{peer[1]}"),
                             name=f"{self._name}-data-conn", daemon=True).start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        staging = self._staging.get()
        try:
            serve_connection(conn, self._sink, staging, peer)
        except Exception:  # noqa: BLE001 - a bug in one connection must not kill the listener
            log.exception("data plane connection from %s failed", peer)
        finally:
            self._staging.put(staging)
            with self._lock:
                self._connections.discard(conn)
            conn.close()
