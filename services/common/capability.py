"""Write capabilities of the replication data plane: an HMAC-SHA256 over the
claims of one reservation, minted by the kvstore that holds the
reservation (its Reserve answer) and checked by the same kvstore when bytes
arrive for it (TCP data plane, WriteChunks, Commit, Abort). Pure: no grpc,
no sockets.

Token layout (big-endian), at most MAX_TOKEN_BYTES (4,161; ~100 in practice):

    version  B      TOKEN_VERSION
    expires  d      node clock, seconds (the minting kvstore's Clock)
    lo, hi   QQ     byte range [lo, hi) of the reservation the bearer may write
    4 x (H + utf-8) handle, order id, source node, target node
    tag      32     HMAC-SHA256(key, DOMAIN || everything above)

Invariants:
- the key never leaves the process that minted the token: minter and
  checker are the same kvstore, so no key is distributed (docs/security.md
  says why that beats a cluster key handed out by the scheduler);
- a token verifies only under its key, byte for byte: any change to the
  claims or the tag fails (the tag is compared with hmac.compare_digest, in
  constant time), as does a token of another length or version;
- claims are checked after the tag, so a forged token learns nothing about
  which claim was wrong.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass

from speckv.services.common.errors import PermissionDenied

TOKEN_VERSION = 1
DOMAIN = b"speckv/write-capability/v1\x00"  # keeps this key's MACs apart from any other use of it
SECRET_DOMAIN = b"speckv/write-capability-secret/v1\x00"
KEY_BYTES = 32
TAG_BYTES = 32
MAX_FIELD_BYTES = 1024  # an identifier is at most 256 characters (validate.py), 4 UTF-8 bytes each
_FIXED = struct.Struct("!BdQQ")
_LEN = struct.Struct("!H")
MAX_TOKEN_BYTES = _FIXED.size + 4 * (_LEN.size + MAX_FIELD_BYTES) + TAG_BYTES


@dataclass(frozen=True, slots=True)
class Capability:
    """What a token lets its bearer do: write bytes [lo, hi) of reservation
    `handle` (order `order_id`, from `source_node` to `target_node`) until
    `expires_s` on the minting node's clock (seconds)."""

    handle: str
    order_id: str
    source_node: str
    target_node: str
    lo: int
    hi: int
    expires_s: float

    def covers(self, offset: int, size: int) -> bool:
        """[offset, offset + size) lies inside the granted range."""
        return self.lo <= offset and offset + size <= self.hi and size >= 0

    def encode_claims(self) -> bytes:
        parts = [_FIXED.pack(TOKEN_VERSION, self.expires_s, self.lo, self.hi)]
        for value in (self.handle, self.order_id, self.source_node, self.target_node):
            raw = value.encode("utf-8")
            if len(raw) > MAX_FIELD_BYTES:
                raise ValueError(f"capability field of {len(raw)} bytes, at most {MAX_FIELD_BYTES}")
            parts += [_LEN.pack(len(raw)), raw]
        return b"".join(parts)


class CapabilityKey:
    """One node's signing key (random per process unless given)."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes | None = None) -> None:
        key = secrets.token_bytes(KEY_BYTES) if key is None else key
        if len(key) < KEY_BYTES:
            raise ValueError(f"a capability key needs at least {KEY_BYTES} bytes, got {len(key)}")
        self._key = bytes(key)

    def sign(self, capability: Capability) -> bytes:
        claims = capability.encode_claims()
        return claims + self._tag(claims)

    def verify(self, token: bytes, now_s: float, *, handle: str, offset: int = 0, size: int = 0) -> Capability:
        """The capability token proves for writing [offset, offset+size) of
        handle at now_s; PermissionDenied (saying which check failed, never
        why a tag differs) otherwise."""
        if not token:
            raise PermissionDenied(f"reservation {handle}: no write capability presented (Reserve returns one)")
        if len(token) > MAX_TOKEN_BYTES or len(token) <= TAG_BYTES + _FIXED.size:
            raise PermissionDenied(f"reservation {handle}: malformed write capability ({len(token)} bytes)")
        claims, tag = token[:-TAG_BYTES], token[-TAG_BYTES:]
        if not hmac.compare_digest(self._tag(claims), tag):
            raise PermissionDenied(f"reservation {handle}: write capability not valid (forged, tampered, or "
                                   "minted by another node)")
        capability = _decode(claims, handle)
        if capability.handle != handle:
            raise PermissionDenied(f"reservation {handle}: the write capability is for reservation "
                                   f"{capability.handle}")
        if now_s >= capability.expires_s:
            raise PermissionDenied(f"reservation {handle}: write capability expired at {capability.expires_s:.3f} "
                                   f"(now {now_s:.3f})")
        if not capability.covers(offset, size):
            raise PermissionDenied(f"reservation {handle}: bytes {offset}+{size} outside the capability's "
                                   f"{capability.lo}..{capability.hi}")
        return capability

    def secret(self, token: bytes) -> bytes:
        """The secret of a token this key minted: what its writer must prove
        it holds on the data plane (services/kvstore/dataplane/possession.py).
        Derived, not stored, so a node keeps no state per token; only this
        key's holder can compute it from the token."""
        return hmac.digest(self._key, SECRET_DOMAIN + token, hashlib.sha256)

    def _tag(self, claims: bytes) -> bytes:
        return hmac.digest(self._key, DOMAIN + claims, hashlib.sha256)


def _decode(claims: bytes, handle: str) -> Capability:
    """Claims whose tag verified: only our own encoder wrote them, so a
    failure here is a version we do not speak."""
    try:
        version, expires, lo, hi = _FIXED.unpack_from(claims)
        if version != TOKEN_VERSION:
            raise ValueError(f"version {version}")
        pos, fields = _FIXED.size, []
        for _ in range(4):
            (n,) = _LEN.unpack_from(claims, pos)
            pos += _LEN.size
            fields.append(claims[pos:pos + n].decode("utf-8"))
            pos += n
        if pos != len(claims):
            raise ValueError("trailing bytes")
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise PermissionDenied(f"reservation {handle}: write capability not readable ({exc})") from None
    return Capability(fields[0], fields[1], fields[2], fields[3], lo, hi, expires)
