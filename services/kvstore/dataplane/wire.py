"""Framing of the bulk TCP data plane (source -> target), and exact reads.

One connection carries chunks for one or more reservations; every chunk is

    header  !4sBHxQQI  magic b"SKV1", kind, len(handle), offset, length, crc32c
    handle  len(handle) bytes of UTF-8
    payload length bytes (CHUNK only)
    tag     16 bytes (CHUNK only, data_plane_auth on: its MAC, possession.py)

kind CHUNK writes payload at byte `offset` of the reservation `handle`; kind
END (offset, length, crc 0) asks the target to confirm everything written to
`handle` so far; kind AUTH carries `length` bytes of payload, the write
capability of `handle` (services/common/capability.py; offset and crc 0)
followed by a 32-byte proof that the writer holds its secret, which a
target with data_plane_auth on needs once per handle per connection before
any CHUNK or END of it; such a target first sends each connection a
CHALLENGE (possession.py: b"SKVC" and the nonce the proof is over). The
target answers an END, and any error, with one reply

    reply   !4sIQI  magic b"SKVR", status, bytes_received, len(message)
    message len(message) bytes of UTF-8

where status is the gRPC status code number (0 OK) of the domain error; after
an error reply the target closes the connection. Offsets and lengths are
bytes; a chunk is at most MAX_CHUNK_BYTES so a receiver's staging buffer is
bounded.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from enum import IntEnum

from speckv.services.common import errors
from speckv.services.common.capability import MAX_TOKEN_BYTES

MAGIC, REPLY_MAGIC = b"SKV1", b"SKVR"
HEADER = struct.Struct("!4sBHxQQI")
REPLY = struct.Struct("!4sIQI")
MAX_HANDLE_BYTES = 256
MAX_CHUNK_BYTES = 4 * 1024 * 1024
MAX_MESSAGE_BYTES = 4096
MAX_AUTH_BYTES = MAX_TOKEN_BYTES + 32  # a token and its proof of possession (possession.PROOF_BYTES)

# Status numbers on the wire: the gRPC code numbers (grpc.StatusCode values),
# spelled out so this module does not import grpc.
OK = 0
STATUS_OF_ERROR: dict[type[errors.SpeckvError], int] = {
    errors.InvalidArgument: 3, errors.NotFound: 5, errors.AlreadyExists: 6, errors.ResourceExhausted: 8,
    errors.FailedPrecondition: 9, errors.Aborted: 10, errors.Unavailable: 14, errors.PermissionDenied: 7,
    errors.Unauthenticated: 16,
}
ERROR_OF_STATUS = {code: cls for cls, code in STATUS_OF_ERROR.items()}


class Kind(IntEnum):
    CHUNK = 1
    END = 2
    AUTH = 3


class ConnectionLost(errors.Unavailable):
    """The peer closed the connection, or it broke, in the middle of a frame."""


@dataclass(frozen=True, slots=True)
class Frame:
    kind: Kind
    handle: str
    offset: int
    length: int
    crc32c: int


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    bytes_received: int
    message: str

    def raise_for_status(self, where: str) -> None:
        if self.status != OK:
            cls = ERROR_OF_STATUS.get(self.status, errors.Unavailable)
            raise cls(f"{where}: {self.message}")


def status_of(exc: errors.SpeckvError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF_ERROR:
            return STATUS_OF_ERROR[cls]
    return STATUS_OF_ERROR[errors.FailedPrecondition]


def encode_header(out: bytearray, kind: Kind, handle: bytes, offset: int, length: int, crc: int) -> memoryview:
    """Header + handle packed into out (reused by the caller); returns the view to send."""
    if len(handle) > MAX_HANDLE_BYTES:
        raise errors.InvalidArgument(f"handle is {len(handle)} bytes, at most {MAX_HANDLE_BYTES}")
    HEADER.pack_into(out, 0, MAGIC, kind, len(handle), offset, length, crc)
    end = HEADER.size + len(handle)
    out[HEADER.size:end] = handle
    return memoryview(out)[:end]


def header_buffer() -> bytearray:
    return bytearray(HEADER.size + MAX_HANDLE_BYTES)


def read_frame(sock: socket.socket, scratch: bytearray) -> Frame | None:
    """The next frame header and handle; None on a clean EOF between frames.
    scratch is a reused header_buffer(). Bad magic, kind or sizes raise
    InvalidArgument; EOF inside the header raises ConnectionLost."""
    view = memoryview(scratch)
    if not recv_exact(sock, view[:HEADER.size], eof_ok=True):
        return None
    kind, handle_len, offset, length, crc = parse_header(scratch)
    recv_exact(sock, view[HEADER.size:HEADER.size + handle_len])
    return Frame(kind, decode_handle(scratch, handle_len), offset, length, crc)


def parse_header(scratch: bytes | bytearray | memoryview) -> tuple[Kind, int, int, int, int]:
    """(kind, handle length, offset, length, crc32c) of the HEADER.size bytes
    at the start of scratch; bad magic, kind or sizes raise InvalidArgument."""
    magic, kind, handle_len, offset, length, crc = HEADER.unpack_from(scratch)
    if magic != MAGIC:
        raise errors.InvalidArgument(f"data plane: bad frame magic {magic!r}")
    if kind not in (Kind.CHUNK, Kind.END, Kind.AUTH):
        raise errors.InvalidArgument(f"data plane: unknown frame kind {kind}")
    if not 0 < handle_len <= MAX_HANDLE_BYTES:
        raise errors.InvalidArgument(f"data plane: handle length {handle_len} outside 1..{MAX_HANDLE_BYTES}")
    if kind == Kind.CHUNK and not 0 < length <= MAX_CHUNK_BYTES:
        raise errors.InvalidArgument(f"data plane: chunk length {length} outside 1..{MAX_CHUNK_BYTES}")
    if kind == Kind.AUTH and not 0 < length <= MAX_AUTH_BYTES:
        raise errors.InvalidArgument(f"data plane: capability length {length} outside 1..{MAX_AUTH_BYTES}")
    return Kind(kind), handle_len, offset, length, crc


def decode_handle(scratch: bytes | bytearray | memoryview, handle_len: int) -> str:
    """The handle that follows the header in scratch."""
    return bytes(scratch[HEADER.size:HEADER.size + handle_len]).decode("utf-8", errors="replace")


def recv_exact(sock: socket.socket, view: memoryview, *, eof_ok: bool = False) -> bool:
    """Fills view from sock (MSG_WAITALL: one syscall in the common case).
    Returns False on EOF before the first byte when eof_ok; any other EOF
    raises ConnectionLost (a short read)."""
    got, size = 0, len(view)
    while got < size:
        n = sock.recv_into(view[got:], size - got, socket.MSG_WAITALL)
        if n == 0:
            if got == 0 and eof_ok:
                return False
            raise ConnectionLost(f"data plane: connection closed after {got} of {size} bytes of a frame")
        got += n
    return True


def recv_views(sock: socket.socket, views: list[memoryview], total: int = -1) -> None:
    """Fills views (total bytes in all, if the caller knows) in order: one
    recvmsg_into (scatter, MSG_WAITALL) in the common case. EOF before all
    is filled raises ConnectionLost."""
    if total < 0:
        total = sum(len(v) for v in views)
    got = sock.recvmsg_into(views, 0, socket.MSG_WAITALL)[0]
    while got < total:
        if got == 0:
            raise ConnectionLost(f"data plane: connection closed before {total} bytes of a chunk arrived")
        views = _advance(views, got)
        total -= got
        got = sock.recvmsg_into(views, 0, socket.MSG_WAITALL)[0]


def send_views(sock: socket.socket, views: list[memoryview], total: int = -1) -> None:
    """Sends every byte of views (total bytes in all, if the caller knows)
    in order: one sendmsg (gather) in the common case; a partial send is
    resumed where it stopped."""
    if total < 0:
        total = sum(len(v) for v in views)
    sent = sock.sendmsg(views)
    while sent < total:
        views = _advance(views, sent)
        total -= sent
        sent = sock.sendmsg(views)


def _advance(views: list[memoryview], done: int) -> list[memoryview]:
    """views without their first `done` bytes."""
    for i, view in enumerate(views):
        if done < len(view):
            return [view[done:], *views[i + 1:]]
        done -= len(view)
    return []


def send_reply(sock: socket.socket, status: int, bytes_received: int, message: str) -> None:
    text = message.encode("utf-8")[:MAX_MESSAGE_BYTES]
    sock.sendall(REPLY.pack(REPLY_MAGIC, status, bytes_received, len(text)) + text)


def read_reply(sock: socket.socket) -> Reply:
    head = bytearray(REPLY.size)
    recv_exact(sock, memoryview(head))
    magic, status, received, text_len = REPLY.unpack(head)
    if magic != REPLY_MAGIC or text_len > MAX_MESSAGE_BYTES:
        raise errors.Unavailable(f"data plane: malformed reply (magic {magic!r}, message {text_len} bytes)")
    text = bytearray(text_len)
    recv_exact(sock, memoryview(text))
    return Reply(status, received, text.decode("utf-8", errors="replace"))
