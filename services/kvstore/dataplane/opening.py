"""A data connection's opening frame, read a piece at a time from a
non-blocking socket by the listener's gate loop (listener.py), so an
unauthenticated connection costs a row and a few hundred bytes, never a
thread. Pure: the caller does the I/O (`want()` is the view to receive
into next, `advance(n)` takes what landed).

The opening frame is the first frame of the connection (wire.py): its
header, its handle and, for AUTH, its capability token. Nothing past it is
read here: a CHUNK's payload (data_plane_auth off) stays in the socket for
the connection's own thread. Bad magic, kind or sizes raise InvalidArgument
as soon as the header is in (wire.parse_header), before the handle is read.
"""
from __future__ import annotations

from dataclasses import dataclass

from speckv.services.common.capability import Capability
from speckv.services.kvstore.dataplane import wire


@dataclass(frozen=True, slots=True)
class Opening:
    """A connection's first frame, already read off the socket. token: the
    AUTH frame's payload (capability and proof; b"" for CHUNK or END);
    nonce: the challenge this connection was sent (b"": none, without
    data_plane_auth); capability and key: what the AUTH proved, the
    capability and its chunks' MAC key (set once verified)."""

    frame: wire.Frame
    token: bytes = b""
    capability: Capability | None = None
    nonce: bytes = b""
    key: bytes = b""


class OpeningReader:
    """Accumulates one opening frame. Holds the header buffer (about 300
    bytes) and, once an AUTH header is in, its token's buffer (at most
    capability.MAX_TOKEN_BYTES)."""

    __slots__ = ("_scratch", "_token", "_got", "_need", "_header")

    def __init__(self) -> None:
        self._scratch = wire.header_buffer()
        self._token: bytearray | None = None
        self._got = 0
        self._need = wire.HEADER.size  # bytes of the current part (header, then handle, then token)
        self._header: tuple[wire.Kind, int, int, int, int] | None = None

    def want(self) -> memoryview:
        """Where the next received bytes go (never empty before done)."""
        if self._token is not None:
            return memoryview(self._token)[self._got:]
        start = 0 if self._header is None else wire.HEADER.size
        return memoryview(self._scratch)[start + self._got:start + self._need]

    def advance(self, received: int) -> Opening | None:
        """Takes `received` bytes written into want(); the Opening once the
        whole frame is in, None while more is needed. Raises InvalidArgument
        for a bad header."""
        self._got += received
        if self._got < self._need:
            return None
        if self._header is None:
            self._header = wire.parse_header(self._scratch)
            self._got, self._need = 0, self._header[1]  # the handle next
            return None
        kind, handle_len, offset, length, crc = self._header
        if kind is wire.Kind.AUTH and self._token is None:
            self._token = bytearray(length)
            self._got, self._need = 0, length
            return None
        frame = wire.Frame(kind, wire.decode_handle(self._scratch, handle_len), offset, length, crc)
        return Opening(frame, bytes(self._token) if self._token is not None else b"")
