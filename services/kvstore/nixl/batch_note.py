"""The note a NIXL writer attaches to each transfer into a reservation, which
NIXL delivers to the target once that transfer's bytes have landed: which
bytes of which reservation it wrote, and their crc32c as the source holds
them (the chunk's, in canonical block order, as on the TCP data plane),
folded from the source's cached segment checksums (batch_crcs).

Wire form (ASCII): `speckv-batch/1 <handle> <offset> <size> <crc32c>`,
decimal integers. The target (landing.py) trusts none of it: the handle
must be one of its own open NIXL reservations, the range must lie inside it
and be written once, and the crc32c is compared with the bytes it reads
from its pages. Pure: no NIXL here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speckv.services.kvstore.checksum import fold
from speckv.services.kvstore.nixl.layout import Batch

PREFIX = b"speckv-batch/1"
MAX_NOTE_BYTES = 256  # a handle is a short identifier; anything longer is not ours
UINT32 = 2**32
UINT64 = 2**64


@dataclass(frozen=True, slots=True)
class BatchNote:
    """Bytes [offset, offset + size) of reservation handle, crc32c as sent."""

    handle: str
    offset: int
    size: int
    crc32c: int

    def encode(self) -> bytes:
        return b" ".join([PREFIX, self.handle.encode(), b"%d" % self.offset, b"%d" % self.size, b"%d" % self.crc32c])


def batch_crcs(batches: Sequence[Batch], segment_crcs: np.ndarray, block_bytes: int,
               segment_bytes: int) -> dict[int, int]:
    """offset -> crc32c of each batch's bytes in the reservation, folded from
    the source pages' segment checksums ([pages, 2 * layers], in the order
    the batches were cut from: batch.first indexes it)."""
    return {b.first * block_bytes: fold(0, segment_crcs[b.first:b.first + b.pages].ravel().tolist(), segment_bytes)
            for b in batches}


def notes_for(handle: str, batches: Sequence[Batch], crcs: dict[int, int], block_bytes: int) -> list[bytes]:
    """The encoded note of each batch (crcs: batch_crcs')."""
    return [BatchNote(handle, b.first * block_bytes, b.nbytes, crcs[b.first * block_bytes]).encode()
            for b in batches]


def parse(message: bytes) -> BatchNote | None:
    """The note in message; None when it is not a well-formed batch note
    (another use of NIXL notifications, or garbage from a peer)."""
    if len(message) > MAX_NOTE_BYTES or not message.startswith(PREFIX + b" "):
        return None
    parts = message.split(b" ")
    if len(parts) != 5 or not all(p.isdigit() for p in parts[2:]):
        return None
    try:
        handle = parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None
    offset, size, crc = (int(p) for p in parts[2:])
    if not handle or size <= 0 or offset >= UINT64 or size >= UINT64 or crc >= UINT32:
        return None
    return BatchNote(handle, offset, size, crc)
