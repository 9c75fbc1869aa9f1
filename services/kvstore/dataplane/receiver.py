"""Target side of the TCP data plane: one connection's frames into the store.

For each CHUNK frame the receiver first asks the sink whether the handle is a
live reservation and the range fits (begin_write); only then does it read the
payload. On a host pool it is received straight into the reserved pages (no
copy, no allocation): begin_write registers the write, so the pages cannot be
freed or reused while the socket fills them even though the store lock is not
held, and hands out memoryviews of the page segments, filled with one
recvmsg_into (scatter, MSG_WAITALL) per chunk. The chunk (and its MAC tag,
read right after it) then goes to the connection's checking thread
(checker.py), which takes the crc32c of every segment, folds the chunk's
(checksum.fold), feeds the MAC, and ends the write (finish_write compares the
crc32c with the header's and keeps the segment checksums for when this node
is the source) while this thread receives the next chunk. At most one chunk
is being checked at a time; a chunk that fails is answered as below at the
next frame, or at once when the sender has paused (sent nothing more). On a
device pool the payload goes through a staging buffer (checksummed piece by
piece as it lands) and write_chunk copies it into the pages (pinned staging +
unpack); the buffer is lent from a shared pool for that chunk only, so an
idle connection holds none.

With a WriteGate (data_plane_auth on), a connection must present a
handle's write capability in an AUTH frame before any CHUNK or END of that
handle, with the proof that it holds the capability's secret over the
connection's nonce (possession.py); the capability is verified once (its
MAC), then each chunk is checked against its range and expiry before its
payload is read, and its GMAC tag (after the payload) is checked by the
checking thread before the chunk is recorded: a bad tag is PERMISSION_DENIED
and aborts like a bad crc32c. The
listener's doorway (doorway.py) reads and verifies a connection's first
frame before the connection gets a thread; it arrives here as `opening`. A frame
without a valid capability is answered PERMISSION_DENIED and the
connection closed, aborting nothing it did not write to: the refusal comes
before the store is asked anything.

Failure rules (nothing half-written is ever published):
- a bad frame, an unknown or dead handle, a range outside the reservation or
  a bad crc32c -> error reply (gRPC status number + message), connection
  closed, and every reservation this connection wrote to is aborted;
- the connection dropping (EOF or reset, inside a frame or before the END of
  a reservation it wrote to), or staying silent past the socket's timeout
  (listener.py sets it) -> those reservations are aborted too.
An END frame confirms a reservation (once every chunk before it passed its
check): it is then left to Commit or its lease.
"""
from __future__ import annotations

import logging
import select
import socket
from typing import Protocol

import numpy as np

from speckv.services.common import errors
from speckv.services.common.capability import Capability
from speckv.services.kvstore import checksum
from speckv.services.kvstore.dataplane import possession, wire
from speckv.services.kvstore.dataplane.checker import Checker, Landed
from speckv.services.kvstore.dataplane.opening import Opening
from speckv.services.kvstore.pool import Buffer
from speckv.services.kvstore.records import ZeroCopyWrite
from speckv.services.kvstore.write_gate import WriteGate

log = logging.getLogger(__name__)
PIECE = 256 * 1024  # bytes received and checksummed at a time into a staging buffer (fits in L2)
MAX_VIEWS = 512  # segment views per recvmsg_into (the kernel allows IOV_MAX = 1024)


class ChunkSink(Protocol):
    """What the receiver needs of the store (KVStoreCore satisfies it)."""

    def begin_write(self, handle: str, offset: int, size: int) -> ZeroCopyWrite | None: ...

    def finish_write(self, write: ZeroCopyWrite, crc32c: int, actual_crc: int, piece_crcs: list[int]) -> int: ...

    def cancel_write(self, write: ZeroCopyWrite) -> None: ...

    def write_chunk(self, handle: str, offset: int, data: Buffer, crc32c: int,
                    actual_crc: int | None = None) -> int: ...

    def abort(self, handle: str, reason: str = "") -> int: ...


class StagingBuffers:
    """Bounded free list of receive buffers of MAX_CHUNK_BYTES, touched once at
    creation so first-touch page faults stay off the hot path; lent per chunk,
    so the buffers in use are at most the connections receiving a chunk now.
    Thread-safe."""

    def __init__(self, keep: int = 4) -> None:
        import threading

        self._keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def get(self) -> np.ndarray:
        with self._lock:
            if self._free:
                return self._free.pop()
        return np.ones(wire.MAX_CHUNK_BYTES, dtype=np.uint8)

    def put(self, buffer: np.ndarray) -> None:
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buffer)


class _OneBuffer:
    """One caller-owned staging buffer, lent to every chunk in turn."""

    def __init__(self, buffer: np.ndarray) -> None:
        self._buffer = buffer

    def get(self) -> np.ndarray:
        return self._buffer

    def put(self, buffer: np.ndarray) -> None:
        pass


def serve_connection(sock: socket.socket, sink: ChunkSink, staging: StagingBuffers | np.ndarray,
                     peer: str = "", gate: WriteGate | None = None, opening: Opening | None = None) -> None:
    """Reads frames until the peer closes; see the module doc for the rules.
    Never raises for peer or client errors (they are logged and answered).
    staging: the pool a chunk for a device pool borrows its buffer from, or
    one buffer of MAX_CHUNK_BYTES that every such chunk uses. gate: checks
    write capabilities (None: none asked, as without data_plane_auth).
    opening: the connection's first frame when the listener already read it
    off the socket (its AUTH token verified into opening.capability)."""
    written: dict[str, int] = {}  # handle -> bytes covered, not yet confirmed by END
    checker = Checker(sink, written.__setitem__, f"data-check-{peer}")
    try:
        _serve_frames(sock, sink, staging, gate, opening, written, checker)
    except wire.ConnectionLost as exc:
        checker.settle()
        _abort_all(sink, written, f"data plane connection from {peer} dropped: {exc}")
    except (BlockingIOError, TimeoutError):  # SO_RCVTIMEO / SO_SNDTIMEO passed with no byte moved
        checker.settle()
        _abort_all(sink, written, f"data plane connection from {peer} idle past its read timeout; closed")
    except errors.SpeckvError as exc:
        failure = checker.error_or(exc)  # a chunk that failed its check is the cause of what tripped later
        _answer_error(sock, failure if isinstance(failure, errors.SpeckvError) else exc, written)
        _abort_all(sink, written, f"data plane from {peer}: {failure}")
    except OSError as exc:
        checker.settle()
        _abort_all(sink, written, f"data plane connection from {peer} broke: {exc}")
    else:
        _abort_all(sink, written, f"data plane connection from {peer} closed before END")
    finally:
        checker.close()


def _serve_frames(sock: socket.socket, sink: ChunkSink, staging: StagingBuffers | np.ndarray,
                  gate: WriteGate | None, opening: Opening | None, written: dict[str, int],
                  checker: Checker) -> None:
    """The frame loop of serve_connection; returns on a clean EOF between
    frames, with every chunk's check in."""
    scratch = wire.header_buffer()
    buffers = staging if isinstance(staging, StagingBuffers) else _OneBuffer(staging)
    allowed: dict[str, Capability] = {}  # handle -> its verified capability, this connection only
    keys: dict[str, bytes] = {}  # handle -> its chunks' MAC key, this connection only
    nonce = opening.nonce if opening is not None else b""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if opening is not None and opening.frame.kind is wire.Kind.AUTH:
        if gate is not None:
            proved = opening if opening.capability is not None else verify_auth(gate, opening)
            allowed[opening.frame.handle], keys[opening.frame.handle] = proved.capability, proved.key
    elif opening is not None:
        _serve_frame(sock, sink, buffers, gate, allowed, written, opening.frame, keys, checker)
    while True:
        if checker.pending and not poller.poll(0):
            checker.collect()  # the sender has paused (for a reply, or for good): answer a failed check now
        frame = wire.read_frame(sock, scratch)
        if frame is None:
            checker.collect()
            return
        if frame.kind is wire.Kind.AUTH:
            token = bytearray(frame.length)
            wire.recv_exact(sock, memoryview(token))
            if gate is not None:
                proved = verify_auth(gate, Opening(frame, bytes(token), nonce=nonce))
                allowed[frame.handle], keys[frame.handle] = proved.capability, proved.key
            continue
        _serve_frame(sock, sink, buffers, gate, allowed, written, frame, keys, checker)


def verify_auth(gate: WriteGate, opening: Opening) -> Opening:
    """An AUTH frame's payload (token || proof) checked: the token's MAC,
    range and expiry, then the proof of its secret over this connection's
    nonce; the opening with its capability and chunk key. PermissionDenied
    otherwise (nothing is asked of the store)."""
    handle, payload = opening.frame.handle, opening.token
    if len(payload) <= possession.PROOF_BYTES:
        raise errors.PermissionDenied(f"reservation {handle}: AUTH carries no proof of the capability's secret")
    token, presented = payload[:-possession.PROOF_BYTES], payload[-possession.PROOF_BYTES:]
    capability = gate.check(token, handle)
    secret = gate.secret(token)
    possession.check_proof(secret, opening.nonce, handle, presented)
    return Opening(opening.frame, token, capability, opening.nonce, possession.chunk_key(secret, opening.nonce, handle))


def _serve_frame(sock: socket.socket, sink: ChunkSink, buffers: StagingBuffers | _OneBuffer, gate: WriteGate | None,
                 allowed: dict[str, Capability], written: dict[str, int], frame: wire.Frame,
                 keys: dict[str, bytes], checker: Checker) -> None:
    """One CHUNK (its payload, and its MAC tag where keyed, read here) or END frame."""
    if gate is not None:
        _authorize(gate, allowed, frame)
    if frame.kind is wire.Kind.END:
        checker.collect()
        received = written.pop(frame.handle, 0)
        wire.send_reply(sock, wire.OK, received, "")
        return
    write = sink.begin_write(frame.handle, frame.offset, frame.length)  # before any payload
    written.setdefault(frame.handle, 0)
    key = keys.get(frame.handle)
    if write is not None:
        _receive_into(sock, sink, write, frame, key, checker)
        return
    checker.collect()
    mac = possession.ChunkMac(key, frame.handle, frame.offset, frame.length, frame.crc32c) if key else None
    buffer = buffers.get()
    try:
        actual = _receive(sock, memoryview(buffer), buffer, frame.length, mac)
        _check_tag(sock, mac, frame)
        written[frame.handle] = sink.write_chunk(frame.handle, frame.offset, buffer[:frame.length],
                                                 frame.crc32c, actual)
    finally:
        buffers.put(buffer)


def _check_tag(sock: socket.socket, mac: possession.ChunkMac | None, frame: wire.Frame) -> None:
    """Reads the chunk's tag and checks it (nothing without a key)."""
    if mac is None:
        return
    tag = bytearray(possession.TAG_BYTES)
    wire.recv_exact(sock, memoryview(tag))
    possession.check_tag(mac, bytes(tag), frame.handle, frame.offset)


def _authorize(gate: WriteGate, allowed: dict[str, Capability], frame: wire.Frame) -> None:
    """Raises PermissionDenied unless this connection presented the frame's
    handle's capability and it still covers the frame (range, expiry)."""
    capability = allowed.get(frame.handle)
    if capability is None:
        raise errors.PermissionDenied(f"data plane: no write capability presented for reservation {frame.handle} "
                                      "on this connection (send its AUTH frame first)")
    if frame.kind is wire.Kind.CHUNK:
        gate.still_covers(capability, frame.handle, frame.offset, frame.length)


def _receive(sock: socket.socket, payload: memoryview, staging: np.ndarray, length: int,
             mac: possession.ChunkMac | None = None) -> int:
    """Receives length bytes into staging; returns their crc32c, computed
    PIECE bytes at a time right after each lands, while they are in cache
    (measured: crc of a cold 4 MiB buffer runs at a third of a hot one's rate)."""
    crc = 0
    for lo in range(0, length, PIECE):
        hi = min(length, lo + PIECE)
        wire.recv_exact(sock, payload[lo:hi])
        crc = checksum.extend(crc, staging[lo:hi])
        if mac is not None:
            mac.update(payload[lo:hi])
    return crc


def _receive_into(sock: socket.socket, sink: ChunkSink, write: ZeroCopyWrite, frame: wire.Frame,
                  key: bytes | None, checker: Checker) -> None:
    """Receives the chunk straight into write.views (one recvmsg_into per
    MAX_VIEWS views), then its tag if keyed, and hands it to the checker,
    which checksums, MACs and ends the write while the next chunk arrives
    (the write is cancelled on any failure here)."""
    views = write.views
    try:
        if len(views) <= MAX_VIEWS:
            wire.recv_views(sock, views, write.size)
        else:
            for lo in range(0, len(views), MAX_VIEWS):
                wire.recv_views(sock, views[lo:lo + MAX_VIEWS])
        tag = b""
        if key is not None:
            raw = bytearray(possession.TAG_BYTES)
            wire.recv_exact(sock, memoryview(raw))
            tag = bytes(raw)
    except BaseException:
        sink.cancel_write(write)
        raise
    checker.submit(Landed(write, frame.handle, frame.offset, frame.crc32c, key, tag))


def _answer_error(sock: socket.socket, exc: errors.SpeckvError, written: dict[str, int]) -> None:
    try:
        wire.send_reply(sock, wire.status_of(exc), sum(written.values()), str(exc))
        _drain(sock)
    except OSError:
        pass  # the peer is gone; the aborts below still run


def _drain(sock: socket.socket, idle_s: float = 2.0) -> None:
    """Reads and drops what the peer still sends until it closes (or idles),
    so closing with unread bytes does not reset the connection and destroy
    the error reply before the peer has read it."""
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(idle_s)
    sink = bytearray(256 * 1024)
    try:
        while sock.recv_into(sink):
            pass
    except OSError:
        pass


def _abort_all(sink: ChunkSink, written: dict[str, int], reason: str) -> None:
    for handle in written:
        try:
            sink.abort(handle, reason)
        except errors.SpeckvError:
            pass  # already closed (aborted, expired, or committed meanwhile)
    if written:
        log.warning("%s; aborted %d reservation(s)", reason, len(written))
