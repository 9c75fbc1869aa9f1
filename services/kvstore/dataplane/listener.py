"""The target's TCP data plane listener: accepts connections on the data port
and serves each on its own thread (services/kvstore/dataplane/receiver.py does the
frames). Not core: it owns sockets and threads.

Sockets get TCP_NODELAY (a chunk's header must not wait for Nagle) and large
kernel buffers so the sender can run a chunk or two ahead of the receiver's
copy into the pool.

Limits (docs/limits.md): at most max_connections are served at once; one
more is answered RESOURCE_EXHAUSTED (a wire reply) and closed by the
acceptor, with no thread of its own. A served connection silent for
read_timeout_s is closed and the reservations it wrote to are aborted, so a
stalled sender cannot keep reserved pages past its lease for long. The
timeout is the kernel's (SO_RCVTIMEO / SO_SNDTIMEO), so the socket stays in
blocking mode and a chunk is still received with one MSG_WAITALL call. A
staging buffer is taken per chunk, only for chunks into a device pool, so an
idle connection holds none.
"""
from __future__ import annotations

import logging
import socket
import struct
import threading

from speckv.services.common.errors import InvalidArgument, ResourceExhausted
from speckv.services.kvstore.dataplane import wire
from speckv.services.kvstore.dataplane.receiver import ChunkSink, StagingBuffers, serve_connection
from speckv.services.kvstore.write_gate import WriteGate

log = logging.getLogger(__name__)
SOCKET_BUFFER_BYTES = 8 * 1024 * 1024


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)


def set_io_timeout(sock: socket.socket, seconds: float) -> None:
    """Each blocking recv or send on sock fails (BlockingIOError, EAGAIN)
    once seconds pass with no byte moved; the socket stays blocking."""
    micros = max(1, round(seconds * 1e6))  # a zero timeval would mean: wait forever
    timeval = struct.pack("ll", micros // 1_000_000, micros % 1_000_000)  # struct timeval (Linux)
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, option, timeval)


class DataPlaneServer:
    """Binds at construction (so the port is known before start).
    max_connections: connections served at once; read_timeout_s: the
    longest a served connection may stay silent, seconds; gate: the write
    capabilities every connection must present (None: none asked)."""

    def __init__(self, sink: ChunkSink, host: str, port: int, name: str = "kvstore", *,
                 max_connections: int = 64, read_timeout_s: float = 10.0, gate: WriteGate | None = None) -> None:
        if max_connections < 1 or not read_timeout_s > 0:
            raise InvalidArgument(f"data plane: max_connections={max_connections} must be >= 1 and "
                                  f"read_timeout_s={read_timeout_s} > 0")
        self._sink = sink
        self._gate = gate
        self._name = name
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.refused_total = 0  # connections refused over the cap (the acceptor's thread writes it)
        self._refusing = False
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

    @property
    def open_connections(self) -> int:
        """Connections being served now."""
        with self._lock:
            return len(self._connections)

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
            with self._lock:
                admitted = len(self._connections) < self.max_connections
                if admitted:
                    self._connections.add(conn)
            if not admitted:
                self.refused_total += 1
                if not self._refusing:  # once per run of refusals: a flood must not flood the log
                    log.warning("data plane %s: %d connections open, refusing more (data_max_connections)",
                                self._name, self.max_connections)
                self._refusing = True
                _refuse(conn, self.max_connections)
                continue
            self._refusing = False
            try:
                tune(conn)
                set_io_timeout(conn, self.read_timeout_s)
                threading.Thread(target=self._serve, args=(conn, f"{peer[0]}:{peer[1]}"),
                                 name=f"{self._name}-data-conn", daemon=True).start()
            except (OSError, RuntimeError):  # reset before it was served, or no thread to be had
                with self._lock:
                    self._connections.discard(conn)
                conn.close()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        try:
            serve_connection(conn, self._sink, self._staging, peer, self._gate)
        except Exception:  # noqa: BLE001 - a bug in one connection must not kill the listener
            log.exception("data plane connection from %s failed", peer)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()


REFUSE_TIMEOUT_S = 1.0  # the acceptor's send of a refusal never waits longer: the reply fits any empty send buffer


def _refuse(conn: socket.socket, limit: int) -> None:
    """Answers a connection over the cap RESOURCE_EXHAUSTED and closes it,
    on the acceptor's thread (a refused connection gets no thread)."""
    error = ResourceExhausted(f"data plane: {limit} connections open, at most {limit} "
                              "(data_max_connections); retry later")
    try:
        conn.settimeout(REFUSE_TIMEOUT_S)
        wire.send_reply(conn, wire.status_of(error), 0, str(error))
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the peer is gone already
    finally:
        conn.close()
