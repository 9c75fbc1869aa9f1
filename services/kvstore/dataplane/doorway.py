"""The data port's doorway: one thread that accepts every connection and
holds it, unauthenticated, until its opening frame is in and verified; only
then is it handed to the listener (listener.py), which gives it a slot of
`data_max_connections` and a thread of its own. Not core: it owns sockets
and a thread; what it may hold is decided by the pure UnauthTable
(admission.py).

Why: before it, an accepted connection took a slot and a thread at once,
so 64 idle sockets with no AUTH frame filled the data plane and every
rightful replication into the node failed RESOURCE_EXHAUSTED (issue 43).
Here an unauthenticated connection costs one table row, its socket and a
~300-byte header buffer, never a thread, and:

- it is refused (a RESOURCE_EXHAUSTED wire reply, then closed) when its
  address already holds `per_address` rows, or when the table is full and
  its address holds the most rows (else it displaces the busiest address's
  oldest row); a refused connection, or a displaced one, holds no row: it
  is kept open, unread, until the deadline below and only then answered
  and closed, so a flooder that reconnects the moment it is ended is slowed
  to one connect per deadline per socket (at most hold_max are held: one more releases the
  oldest early; a held socket is not watched, so holding costs no more
  system calls than refusing at once);
- it is closed (an UNAVAILABLE wire reply, best effort) once its deadline
  (`data_auth_timeout_s`) passes before its opening frame is in;
- with challenge (data_plane_auth on) it is sent a fresh nonce as soon as
  it is admitted (possession.py: its AUTH must prove the capability's
  secret over it);
- its opening frame is read without blocking, a part at a time (header,
  handle, AUTH token: opening.py); a bad header, a first frame that is not
  AUTH where capabilities are asked, or a capability that does not verify is
  answered (INVALID_ARGUMENT / PERMISSION_DENIED) and the connection then
  drained to its close or its deadline, so the reply is not lost to a
  reset; the same for a verified one when every slot is taken
  (RESOURCE_EXHAUSTED).

Accepted sockets stay in blocking mode (what the connection's own thread
wants); every receive and send here is MSG_DONTWAIT, sends best effort (a
reply fits any empty send buffer): the loop never waits on one peer, and
saves two system calls a connection. The table and the pending
connections are this thread's alone; counts are read by the metrics thread
(integers, read whole).
"""
from __future__ import annotations

import collections
import errno
import itertools
import logging
import resource
import selectors
import socket
import threading
import time
from dataclasses import replace
from typing import Callable

from speckv.services.common import errors
from speckv.services.kvstore.dataplane import possession, wire
from speckv.services.kvstore.dataplane.admission import ConnId, Refusal, UnauthTable
from speckv.services.kvstore.dataplane.opening import Opening, OpeningReader

log = logging.getLogger(__name__)
ACCEPT_BURST = 64  # connections accepted per wake before the pending ones are read again
DRAIN_BYTES = 64 * 1024
HOLD_PER_ROW = 4  # refused connections held per row of the table, at most
WARN_EVERY_S = 10.0  # at most one refusal warning this often
FD_PAUSE_S = 0.05  # out of file descriptors: the queued connection stays queued; try again after this

Verify = Callable[[Opening], Opening]  # the opening with its capability proved; raises a SpeckvError
HandOff = Callable[[socket.socket, str, Opening], None]  # slot + thread; raises ResourceExhausted when none


class _Pending:
    """One unauthenticated connection: its socket, where it came from, and
    its opening frame so far (draining: answered, read until it closes)."""

    __slots__ = ("conn_id", "sock", "peer", "reader", "draining", "nonce")

    def __init__(self, conn_id: ConnId, sock: socket.socket, peer: str) -> None:
        self.conn_id = conn_id
        self.sock = sock
        self.peer = peer
        self.reader = OpeningReader()
        self.draining = False
        self.nonce = b""  # the challenge sent to it (challenging doorways only)


class Doorway:
    """Runs the accept-and-authenticate loop on listener (bound and
    listening) until stop(). verify checks an opening frame; hand_off takes
    a verified connection away (in blocking mode, as accepted)."""

    def __init__(self, listener: socket.socket, table: UnauthTable, verify: Verify, hand_off: HandOff,
                 name: str = "kvstore", *, challenge: bool = False) -> None:
        self._challenge = challenge  # send each admitted connection a nonce to prove possession over
        self._listener = listener
        self._table = table
        self._verify = verify
        self._hand_off = hand_off
        self._name = name
        self._pending: dict[ConnId, _Pending] = {}
        self._ids = itertools.count(1)
        self._selector = selectors.DefaultSelector()
        self._waker, self._wake = socket.socketpair()
        self._stopping = threading.Event()
        self._warned_at = -WARN_EVERY_S
        # Refused connections held until their deadline (deadline, socket, answer), oldest first; at most
        # HOLD_PER_ROW per row and a quarter of the file descriptors this process may open.
        self._held: collections.deque[tuple[float, socket.socket, errors.SpeckvError]] = collections.deque()
        self.hold_max = min(HOLD_PER_ROW * table.capacity, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4)
        self.denied_total = 0  # openings answered with an error (bad frame, no or bad capability)
        self._thread = threading.Thread(target=self._run, name=f"{name}-data-doorway", daemon=True)

    @property
    def table(self) -> UnauthTable:
        return self._table

    @property
    def held(self) -> int:
        """Refused connections held open until their deadline now."""
        return len(self._held)

    def start(self) -> None:
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._waker, selectors.EVENT_READ, self._waker)
        self._thread.start()

    def stop(self) -> None:
        """Stops accepting, closes every unauthenticated connection and the listener."""
        self._stopping.set()
        try:
            self._wake.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        else:
            self._close_all()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                deadlines = [d for d in (self._table.next_deadline(), self._held[0][0] if self._held else None)
                             if d is not None]
                timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
                for key, _ in self._selector.select(timeout):
                    if key.data is None:
                        self._accept_burst()
                    elif isinstance(key.data, _Pending):
                        self._read(key.data)
                for conn_id in self._table.expire(time.monotonic()):
                    self._drop(conn_id, errors.Unavailable(
                        f"data plane: no verified opening frame within data_auth_timeout_s="
                        f"{self._table.deadline_s:g} s; closed"))
                self._release_held(time.monotonic())
        except Exception:  # noqa: BLE001 - logged; the data port then closes rather than hang half-alive
            log.exception("data plane %s: the doorway loop failed", self._name)
        finally:
            self._close_all()

    def _accept_burst(self) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("data plane %s: cannot accept (%s); pausing", self._name, exc)
                    self._stopping.wait(FD_PAUSE_S)
                return  # the listener closed, or an aborted handshake: the loop goes on
            self._admit(sock, address)

    def _admit(self, sock: socket.socket, address: tuple) -> None:
        conn_id = ConnId(next(self._ids))
        admission = self._table.admit(conn_id, address[0], time.monotonic())
        if not admission.admitted:
            self._note_refusal(address[0], admission.refusal)
            self._hold(sock, errors.ResourceExhausted(_refusal_text(admission.refusal, self._table)))
            return
        if admission.displaced is not None:
            self._displace(admission.displaced, errors.ResourceExhausted(
                f"data plane: {self._table.capacity} unauthenticated connections waiting "
                "(data_unauth_max_connections); this one was the oldest of the busiest address"))
        pending = _Pending(conn_id, sock, f"{address[0]}:{address[1]}")
        if self._challenge:
            pending.nonce, raw = possession.new_challenge()
            try:
                sock.send(raw, socket.MSG_DONTWAIT)  # fits any empty send buffer
            except OSError:
                pass  # gone already: its read says so
        self._pending[conn_id] = pending
        self._selector.register(sock, selectors.EVENT_READ, pending)

    def _read(self, pending: _Pending) -> None:
        if pending.draining:
            self._drain(pending)
            return
        while True:
            try:
                got = pending.sock.recv_into(pending.reader.want(), 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                got = 0
            if got == 0:  # the peer went away (or reset) before its opening frame was in
                self._close(pending)
                return
            try:
                opening = pending.reader.advance(got)
            except errors.SpeckvError as exc:
                self._deny(pending, exc)
                return
            if opening is not None:
                self._authenticate(pending, opening)
                return

    def _authenticate(self, pending: _Pending, opening: Opening) -> None:
        try:
            verified = self._verify(replace(opening, nonce=pending.nonce))
        except errors.SpeckvError as exc:
            self._deny(pending, exc)
            return
        self._selector.unregister(pending.sock)  # from here on the socket is read by its own thread only
        try:
            self._hand_off(pending.sock, pending.peer, verified)
        except errors.SpeckvError as exc:  # no slot: answered like any refusal, drained under its row
            self._selector.register(pending.sock, selectors.EVENT_READ, pending)
            self._answer(pending, exc)
            return
        except OSError:
            self._close(pending)
            return
        del self._pending[pending.conn_id]
        self._table.settle(pending.conn_id)

    def _deny(self, pending: _Pending, exc: errors.SpeckvError) -> None:
        """Answers exc, then reads and drops what the peer still sends until
        it closes or its row's deadline passes (a reset would destroy the
        reply before the peer read it). Counted in denied_total."""
        self.denied_total += 1
        self._answer(pending, exc)

    def _answer(self, pending: _Pending, exc: errors.SpeckvError) -> None:
        _send_reply(pending.sock, exc)
        pending.draining = True
        try:
            pending.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _drain(self, pending: _Pending) -> None:
        sink = bytearray(DRAIN_BYTES)
        try:
            while pending.sock.recv_into(sink, 0, socket.MSG_DONTWAIT):
                pass
        except BlockingIOError:
            return
        except OSError:
            pass
        self._close(pending)

    def _close(self, pending: _Pending) -> None:
        self._table.settle(pending.conn_id)
        self._forget(pending)

    def _drop(self, conn_id: ConnId, exc: errors.SpeckvError | None) -> None:
        """Closes a connection whose row is already gone (expired)."""
        pending = self._pending.get(conn_id)
        if pending is None:
            return
        if exc is not None and not pending.draining:
            _send_reply(pending.sock, exc)
        self._forget(pending)

    def _displace(self, conn_id: ConnId, exc: errors.SpeckvError) -> None:
        """A connection whose row went to a newcomer: no longer read, held
        to be answered later like a refused one (answering at once would let
        a flood from many addresses displace and reconnect in a loop)."""
        pending = self._pending.pop(conn_id, None)
        if pending is None:
            return
        self._selector.unregister(pending.sock)
        if pending.draining:
            pending.sock.close()
        else:
            self._hold(pending.sock, exc)

    def _forget(self, pending: _Pending) -> None:
        self._pending.pop(pending.conn_id, None)
        try:
            self._selector.unregister(pending.sock)
        except (KeyError, ValueError):
            pass
        pending.sock.close()

    def _note_refusal(self, address: str, refusal: Refusal | None) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:  # a flood must not flood the log
            self._warned_at = now
            log.warning("data plane %s: refusing unauthenticated connections (%s; %d waiting, %d from %s)",
                        self._name, refusal.value if refusal else "?", len(self._table),
                        self._table.held_by(address), address)

    def _hold(self, sock: socket.socket, exc: errors.SpeckvError) -> None:
        """Keeps a refused connection open, unread and unwatched, until
        data_auth_timeout_s from now, then answers and closes it: a flooder
        that reconnects as soon as it is refused then reconnects once per
        deadline, not as fast as the node can refuse (measured in
        docs/limits.md). At most hold_max are held: one more answers and
        closes the oldest at once (never more work than refusing at once)."""
        if len(self._held) >= self.hold_max:
            _, oldest, answer = self._held.popleft()
            self._release(oldest, answer)
        self._held.append((time.monotonic() + self._table.deadline_s, sock, exc))

    @staticmethod
    def _release(sock: socket.socket, exc: errors.SpeckvError) -> None:
        _send_reply(sock, exc)
        sock.close()

    def _release_held(self, now: float) -> None:
        while self._held and self._held[0][0] <= now:
            _, sock, exc = self._held.popleft()
            self._release(sock, exc)

    def _close_all(self) -> None:
        for _, sock, _exc in self._held:
            sock.close()
        self._held.clear()
        for pending in list(self._pending.values()):
            self._table.settle(pending.conn_id)
            self._forget(pending)
        for sock in (self._listener, self._waker, self._wake):
            try:
                sock.close()
            except OSError:
                pass
        self._selector.close()


def _refusal_text(refusal: Refusal | None, table: UnauthTable) -> str:
    if refusal is Refusal.PER_ADDRESS:
        return (f"data plane: {table.per_address} unauthenticated connections from this address already "
                "(data_unauth_per_address); retry later")
    return (f"data plane: {table.capacity} unauthenticated connections waiting (data_unauth_max_connections); "
            "retry later")


def _send_reply(sock: socket.socket, exc: errors.SpeckvError) -> None:
    """One wire reply for exc, without blocking; dropped if it does not fit."""
    text = str(exc).encode("utf-8")[:wire.MAX_MESSAGE_BYTES]
    try:
        sock.send(wire.REPLY.pack(wire.REPLY_MAGIC, wire.status_of(exc), 0, len(text)) + text, socket.MSG_DONTWAIT)
    except OSError:
        pass  # gone, or a full buffer: the close says enough
