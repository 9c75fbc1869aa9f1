"""A connection's opening frame read a piece at a time (opening.py): what
arrives in any split makes the same frame, nothing past it is taken, and a
bad header is refused before its handle is read."""
from __future__ import annotations

import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.kvstore.dataplane import wire
from speckv.services.kvstore.dataplane.opening import Opening, OpeningReader


def frame_bytes(kind: wire.Kind, handle: bytes, offset: int = 0, length: int = 0, crc: int = 0) -> bytes:
    return bytes(wire.encode_header(wire.header_buffer(), kind, handle, offset, length, crc))


def feed(reader: OpeningReader, data: bytes, step: int) -> tuple[Opening | None, int]:
    """Feeds data `step` bytes at a time (as short receives would); returns
    the opening and how many bytes were taken."""
    taken = 0
    while taken < len(data):
        view = reader.want()
        n = min(step, len(view), len(data) - taken)
        view[:n] = data[taken:taken + n]
        taken += n
        opening = reader.advance(n)
        if opening is not None:
            return opening, taken
    return None, taken


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_an_auth_frame_in_any_split_gives_its_handle_and_token_and_nothing_more(step):
    token = bytes(range(90))
    data = frame_bytes(wire.Kind.AUTH, b"h-1", length=len(token)) + token + b"CHUNK BYTES"
    opening, taken = feed(OpeningReader(), data, step)
    assert opening == Opening(wire.Frame(wire.Kind.AUTH, "h-1", 0, len(token), 0), token)
    assert taken == len(data) - len(b"CHUNK BYTES")


def test_a_chunk_header_is_an_opening_without_its_payload():
    opening, taken = feed(OpeningReader(), frame_bytes(wire.Kind.CHUNK, b"h", 512, 64, 9) + b"x" * 64, 10_000)
    assert opening == Opening(wire.Frame(wire.Kind.CHUNK, "h", 512, 64, 9))
    assert taken == wire.HEADER.size + 1


def test_a_bad_magic_is_refused_once_the_header_is_in():
    data = b"EVIL" + frame_bytes(wire.Kind.END, b"h")[4:]
    reader = OpeningReader()
    assert feed(reader, data[:wire.HEADER.size - 1], 10_000) == (None, wire.HEADER.size - 1)
    with pytest.raises(InvalidArgument, match="magic"):
        feed(reader, data[wire.HEADER.size - 1:], 10_000)
