"""The target's TCP data plane listener: binds the data port, lets the
doorway (doorway.py) accept connections and read each one's opening frame,
and serves each verified connection on its own thread
(services/kvstore/dataplane/receiver.py does the frames). Not core: it owns
sockets and threads.

Sockets get TCP_NODELAY (a chunk's header must not wait for Nagle) and large
kernel buffers so the sender can run a chunk or two ahead of the receiver's
copy into the pool.

Limits (docs/limits.md):
- a connection holds no slot until its opening frame is in and verified
  (its AUTH capability with data_plane_auth on; any well-formed first frame
  without): until then it is one of at most unauth_max_connections waiting,
  at most unauth_per_address from one address, for at most auth_timeout_s
  (the doorway's UnauthTable, admission.py), on no thread of its own;
- at most max_connections verified ones are served at once; one more is
  answered RESOURCE_EXHAUSTED (a wire reply) by the doorway and closed;
- a served connection silent for read_timeout_s is closed and the
  reservations it wrote to are aborted, so a stalled sender cannot keep
  reserved pages past its lease for long. The timeout is the kernel's
  (SO_RCVTIMEO / SO_SNDTIMEO), so the socket stays in blocking mode and a
  chunk is still received with one MSG_WAITALL call.
A staging buffer is taken per chunk, only for chunks into a device pool, so
an idle connection holds none.
"""
from __future__ import annotations

import logging
import socket
import struct
import threading
from dataclasses import dataclass

from speckv.services.common.errors import InvalidArgument, PermissionDenied, ResourceExhausted
from speckv.services.kvstore.dataplane import wire
from speckv.services.kvstore.dataplane.admission import UnauthTable
from speckv.services.kvstore.dataplane.doorway import Doorway
from speckv.services.kvstore.dataplane.opening import Opening
from speckv.services.kvstore.dataplane.receiver import ChunkSink, StagingBuffers, serve_connection, verify_auth
from speckv.services.kvstore.write_gate import WriteGate

log = logging.getLogger(__name__)
SOCKET_BUFFER_BYTES = 8 * 1024 * 1024
BACKLOG = 1024  # connections the kernel queues before accept (capped by net.core.somaxconn): a flood of
# connects must not crowd a rightful one out of the queue while the doorway catches up


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


@dataclass(frozen=True, slots=True)
class UnauthLimits:
    """Bounds on connections whose opening frame is not yet verified:
    max_connections in all, per_address from one source address (both
    connections), timeout_s each (seconds)."""

    max_connections: int = 256
    per_address: int = 16
    timeout_s: float = 1.0


@dataclass(frozen=True, slots=True)
class ConnectionCounts:
    """Data plane connections ended without being served, by cause, since
    start (the metric speckv.kvstore.dataplane.refused)."""

    refused_slots: int  # verified, but data_max_connections were served already
    refused_per_address: int  # unauthenticated, over data_unauth_per_address
    refused_full: int  # unauthenticated, data_unauth_max_connections waiting and its address the busiest
    displaced: int  # unauthenticated, the busiest address's oldest when a newcomer needed its row
    timed_out: int  # unauthenticated past data_auth_timeout_s
    denied: int  # a bad opening frame, or no / a bad capability

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class DataPlaneServer:
    """Binds at construction (so the port is known before start).
    max_connections: verified connections served at once; read_timeout_s:
    the longest a served connection may stay silent, seconds; gate: the
    write capabilities every connection must present (None: none asked);
    unauth: the bounds on connections not yet verified."""

    def __init__(self, sink: ChunkSink, host: str, port: int, name: str = "kvstore", *,
                 max_connections: int = 64, read_timeout_s: float = 10.0, gate: WriteGate | None = None,
                 unauth: UnauthLimits = UnauthLimits()) -> None:
        if max_connections < 1 or not read_timeout_s > 0:
            raise InvalidArgument(f"data plane: max_connections={max_connections} must be >= 1 and "
                                  f"read_timeout_s={read_timeout_s} > 0")
        try:
            table = UnauthTable(unauth.max_connections, unauth.per_address, unauth.timeout_s)
        except ValueError as exc:
            raise InvalidArgument(f"data plane: {exc}") from None
        self._sink = sink
        self._gate = gate
        self._name = name
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.refused_total = 0  # verified connections refused over the cap (the doorway's thread writes it)
        self._refusing = False
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
        except OSError as exc:
            listener.close()
            raise InvalidArgument(f"data_port={port}: cannot bind {host}:{port}: {exc}") from None
        listener.listen(BACKLOG)
        self.host, self.port = listener.getsockname()[:2]
        self._staging = StagingBuffers()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._doorway = Doorway(listener, table, self._verify, self._hand_off, name, challenge=gate is not None)

    def address(self, advertise_host: str = "") -> str:
        return f"{advertise_host or self.host}:{self.port}"

    @property
    def open_connections(self) -> int:
        """Connections being served now (verified)."""
        with self._lock:
            return len(self._connections)

    @property
    def waiting_connections(self) -> int:
        """Connections accepted whose opening frame is not verified yet."""
        return len(self._doorway.table)

    @property
    def held_connections(self) -> int:
        """Refused connections held open, unread, until their deadline."""
        return self._doorway.held

    def counts(self) -> ConnectionCounts:
        table = self._doorway.table.counts
        return ConnectionCounts(self.refused_total, table.refused_per_address, table.refused_full, table.displaced,
                                table.timed_out, self._doorway.denied_total)

    def start(self) -> "DataPlaneServer":
        self._doorway.start()
        return self

    def stop(self) -> None:
        """Stops accepting, closes the unauthenticated connections and breaks
        the served ones (their reservations are aborted by their threads)."""
        self._doorway.stop()
        with self._lock:
            for conn in list(self._connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _verify(self, opening: Opening) -> Opening:
        """The opening with its capability proved (data_plane_auth on: it must
        be an AUTH frame whose capability verifies and whose proof shows the
        capability's secret over this connection's nonce); PermissionDenied
        else."""
        if self._gate is None:
            return opening
        frame = opening.frame
        if frame.kind is not wire.Kind.AUTH:
            raise PermissionDenied(f"data plane: no write capability presented for reservation {frame.handle} "
                                   "on this connection (send its AUTH frame first)")
        return verify_auth(self._gate, opening)

    def _hand_off(self, conn: socket.socket, peer: str, opening: Opening) -> None:
        """A slot and a thread for a verified connection; ResourceExhausted
        when max_connections are served already."""
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
            raise ResourceExhausted(f"data plane: {self.max_connections} connections open, at most "
                                    f"{self.max_connections} (data_max_connections); retry later")
        self._refusing = False
        try:
            tune(conn)
            set_io_timeout(conn, self.read_timeout_s)
            threading.Thread(target=self._serve, args=(conn, peer, opening),
                             name=f"{self._name}-data-conn", daemon=True).start()
        except (OSError, RuntimeError) as exc:  # reset before it was served, or no thread to be had
            with self._lock:
                self._connections.discard(conn)
            raise OSError(f"data plane connection from {peer}: {exc}") from None

    def _serve(self, conn: socket.socket, peer: str, opening: Opening) -> None:
        try:
            serve_connection(conn, self._sink, self._staging, peer, self._gate, opening)
        except Exception:  # noqa: BLE001 - a bug in one connection must not kill the listener
            log.exception("data plane connection from %s failed", peer)
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()
