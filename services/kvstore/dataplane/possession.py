"""Proof of possession on the TCP data plane (issue 43, item 2): a write
capability (services/common/capability.py) alone no longer lets its bearer
write; the writer must also hold the capability's secret, which only ever
travels over the gRPC control plane (ReserveResponse.capability_secret,
mutual TLS when TLS is on). Pure: no sockets; the node's key stays in
CapabilityKey.

Per connection, with data_plane_auth on:

    target -> source   CHALLENGE  !4s16s  b"SKVC", a fresh random nonce
    source -> target   AUTH       payload = token || proof
                                  proof = HMAC-SHA256(secret, AUTH_DOMAIN || nonce || handle)
    source -> target   CHUNK      header, handle, payload, then a 16-byte tag:
                                  AES-GMAC under key = HMAC-SHA256(secret, KEY_DOMAIN || nonce || handle),
                                  IV = the chunk's offset (8 bytes, big-endian) || 4 zero bytes,
                                  over handle || offset || length || crc32c || payload

Invariants: a sniffed AUTH frame proves nothing on another connection (its
nonce differs); a sniffed token without the secret cannot make a proof; a
chunk's bytes, offset and crc32c cannot be changed in flight without the
tag failing; a (key, IV) pair is never used twice, since the key is per
connection and handle and each byte range of a reservation is written
once (reservations.py). Tags and proofs are compared in constant time.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import struct

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from speckv.services.common.errors import PermissionDenied

CHALLENGE = struct.Struct("!4s16s")
CHALLENGE_MAGIC = b"SKVC"
NONCE_BYTES = 16
PROOF_BYTES = 32
TAG_BYTES = 16
AUTH_DOMAIN = b"speckv/data-plane-auth/v1\x00"
KEY_DOMAIN = b"speckv/data-plane-chunk-key/v1\x00"
_CHUNK_FIELDS = struct.Struct("!QQI")  # offset, length, crc32c


def new_challenge() -> tuple[bytes, bytes]:
    """(nonce, the CHALLENGE bytes that carry it)."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce, CHALLENGE.pack(CHALLENGE_MAGIC, nonce)


def read_challenge(raw: bytes) -> bytes:
    """The nonce of CHALLENGE bytes; ValueError if they are not one."""
    magic, nonce = CHALLENGE.unpack(raw)
    if magic != CHALLENGE_MAGIC:
        raise ValueError(f"not a data plane challenge (magic {magic!r})")
    return nonce


def proof(secret: bytes, nonce: bytes, handle: str) -> bytes:
    return hmac.digest(secret, AUTH_DOMAIN + nonce + handle.encode("utf-8"), hashlib.sha256)


def check_proof(secret: bytes, nonce: bytes, handle: str, presented: bytes) -> None:
    """PermissionDenied unless presented proves the secret over nonce."""
    if not hmac.compare_digest(proof(secret, nonce, handle), presented):
        raise PermissionDenied(f"reservation {handle}: no proof of the capability's secret (a replayed or "
                               "forged AUTH frame)")


def chunk_key(secret: bytes, nonce: bytes, handle: str) -> bytes:
    """The AES-256 key of this connection's chunks of handle."""
    return hmac.digest(secret, KEY_DOMAIN + nonce + handle.encode("utf-8"), hashlib.sha256)


class ChunkMac:
    """The GMAC tag of one chunk, fed its payload a piece at a time (as it
    is sent, or as it lands)."""

    __slots__ = ("_ctx",)

    def __init__(self, key: bytes, handle: str, offset: int, length: int, crc: int) -> None:
        iv = struct.pack("!Q", offset) + bytes(4)
        self._ctx = Cipher(algorithms.AES(key), modes.GCM(iv)).encryptor()
        self._ctx.authenticate_additional_data(handle.encode("utf-8") + _CHUNK_FIELDS.pack(offset, length, crc))

    def update(self, piece: bytes | bytearray | memoryview) -> None:
        self._ctx.authenticate_additional_data(piece)

    def tag(self) -> bytes:
        self._ctx.finalize()
        return self._ctx.tag


def check_tag(mac: ChunkMac, presented: bytes, handle: str, offset: int) -> None:
    if not hmac.compare_digest(mac.tag(), presented):
        raise PermissionDenied(f"reservation {handle}: chunk at offset {offset} failed its MAC (changed in flight, "
                               "or not written by the capability's holder)")
