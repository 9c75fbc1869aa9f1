"""One block record on disk: a 4096-byte header page, then the block's
canonical bytes padded to the 4096-byte alignment O_DIRECT needs.

    offset 0     header (HEADER_BYTES): the fields below, little endian,
                 zero padded; header_crc is the crc32c of the header page
                 with that field zeroed
    offset 4096  payload: payload_len bytes (the block), zero padded to
                 a multiple of ALIGN

Header fields: magic b"SPKVDSK1", version, header_crc, block hash (u64),
layout digest (16 bytes: the model/layout the bytes belong to, see
layout_digest), sequence (u64: the writer's count, newest wins when one hash
appears in two records), payload_len, payload crc32c, parent hash and
whether there is one, family (UTF-8, at most MAX_FAMILY_BYTES; longer ones
are stored empty).

The validity rule (what makes a partial write invisible): a record is valid
exactly when its magic and version are this module's, its header_crc
matches its header page, its payload crc32c over payload_len bytes equals the
header's, and payload_len is the reader's block size. The header and the
payload go down in one positional write (header first in file order), so
a crash mid-write leaves either the old record, the new one, or a mix whose
header crc or payload crc does not match: never a record that passes.
A record whose digest is not the reader's is valid but foreign: never served.
"""
from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass

import numpy as np

from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import BlockHash
from speckv.services.kvstore import checksum

ALIGN = 4096  # O_DIRECT's alignment of offsets, lengths and buffers
HEADER_BYTES = ALIGN
MAGIC = b"SPKVDSK1"
VERSION = 1
DIGEST_BYTES = 16
MAX_FAMILY_BYTES = 2048
# magic, version, header_crc, hash, digest, sequence, payload_len, payload_crc, parent, has_parent, family_len
_FIELDS = struct.Struct(f"<8sII Q{DIGEST_BYTES}s QQI QBH")
_CRC_AT = 12  # byte offset of header_crc


def align_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


def record_bytes(bytes_per_block: int) -> int:
    """Bytes one record of a block of bytes_per_block takes on disk."""
    return HEADER_BYTES + align_up(bytes_per_block)


def layout_digest(geometry: KVGeometry) -> bytes:
    """The model/layout digest records carry: the geometry's name and shape
    and dtype, hashed (blake2b, 16 bytes). A kvstore serves only records of
    its own digest, so a directory reused under another model is never read
    as this one's KV."""
    text = (f"{geometry.name}|{geometry.num_layers}|{geometry.num_kv_heads}|{geometry.head_dim}|"
            f"{geometry.dtype}|{geometry.block_size}")
    return hashlib.blake2b(text.encode(), digest_size=DIGEST_BYTES).digest()


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A page-aligned (mmap-allocated) byte buffer of nbytes, for O_DIRECT."""
    return np.frombuffer(mmap.mmap(-1, max(ALIGN, align_up(nbytes))), dtype=np.uint8)[:nbytes]


@dataclass(frozen=True, slots=True)
class RecordHeader:
    block_hash: BlockHash
    digest: bytes
    sequence: int
    payload_len: int
    payload_crc: int
    parent: BlockHash | None = None
    family: str = ""


def crc32c(data: np.ndarray | bytes) -> int:
    return checksum.crc32c(data)


def encode_header(header: RecordHeader, out: np.ndarray) -> None:
    """Writes header into out[:HEADER_BYTES] (zeroed first), header_crc last."""
    family = header.family.encode()
    if len(family) > MAX_FAMILY_BYTES:
        family = b""
    page = out[:HEADER_BYTES]
    page[:] = 0
    fields = _FIELDS.pack(MAGIC, VERSION, 0, header.block_hash, header.digest, header.sequence,
                          header.payload_len, header.payload_crc, header.parent or 0,
                          header.parent is not None, len(family))
    page[:len(fields)] = np.frombuffer(fields, dtype=np.uint8)
    page[len(fields):len(fields) + len(family)] = np.frombuffer(family, dtype=np.uint8)
    page[_CRC_AT:_CRC_AT + 4] = np.frombuffer(struct.pack("<I", crc32c(page)), dtype=np.uint8)


def decode_header(page: np.ndarray) -> RecordHeader | None:
    """The header in page[:HEADER_BYTES], or None when its magic, version
    or header crc do not check (a slot never written, or torn)."""
    raw = bytes(page[:HEADER_BYTES])
    magic, version, header_crc, block_hash, digest, sequence, payload_len, payload_crc, parent, has_parent, \
        family_len = _FIELDS.unpack_from(raw)
    if magic != MAGIC or version != VERSION or family_len > MAX_FAMILY_BYTES:
        return None
    zeroed = raw[:_CRC_AT] + b"\0\0\0\0" + raw[_CRC_AT + 4:]
    if crc32c(zeroed) != header_crc:
        return None
    family = raw[_FIELDS.size:_FIELDS.size + family_len].decode(errors="replace")
    return RecordHeader(BlockHash(block_hash), digest, sequence, payload_len, payload_crc,
                        BlockHash(parent) if has_parent else None, family)


def payload_of(record: np.ndarray, payload_len: int) -> np.ndarray:
    return record[HEADER_BYTES:HEADER_BYTES + payload_len]


def payload_valid(record: np.ndarray, header: RecordHeader) -> bool:
    """Whether the payload behind header checks (its crc32c)."""
    return crc32c(payload_of(record, header.payload_len)) == header.payload_crc
