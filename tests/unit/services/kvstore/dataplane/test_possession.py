"""Proof of possession on the data plane (possession.py): a proof holds only
for its secret, nonce and handle; a chunk's tag only for its key, fields
and bytes, however the bytes are split; the secret is the minting key's."""
from __future__ import annotations

import pytest

from speckv.services.common.capability import Capability, CapabilityKey
from speckv.services.common.errors import PermissionDenied
from speckv.services.kvstore.dataplane import possession

SECRET, NONCE = b"s" * 32, b"n" * 16


def test_a_challenge_carries_a_fresh_nonce_and_nothing_else_reads_as_one():
    nonce, raw = possession.new_challenge()
    assert possession.read_challenge(raw) == nonce and len(nonce) == possession.NONCE_BYTES
    assert possession.new_challenge()[0] != nonce
    with pytest.raises(ValueError):
        possession.read_challenge(b"SKVR" + nonce)


def test_a_proof_holds_only_for_its_secret_nonce_and_handle():
    good = possession.proof(SECRET, NONCE, "h")
    possession.check_proof(SECRET, NONCE, "h", good)
    for secret, nonce, handle in [(b"t" * 32, NONCE, "h"), (SECRET, b"m" * 16, "h"), (SECRET, NONCE, "h2")]:
        with pytest.raises(PermissionDenied, match="proof"):
            possession.check_proof(secret, nonce, handle, good)


def tag(key: bytes, pieces: list[bytes], handle: str = "h", offset: int = 0, crc: int = 7) -> bytes:
    mac = possession.ChunkMac(key, handle, offset, sum(map(len, pieces)), crc)
    for piece in pieces:
        mac.update(memoryview(piece))
    return mac.tag()


def test_a_chunk_tag_covers_its_bytes_in_any_split_and_every_field():
    key = possession.chunk_key(SECRET, NONCE, "h")
    data = bytes(range(256)) * 40
    good = tag(key, [data])
    assert tag(key, [data[:1], data[1:5000], data[5000:]]) == good and len(good) == possession.TAG_BYTES
    flipped = bytearray(data)
    flipped[100] ^= 1
    assert tag(key, [bytes(flipped)]) != good
    assert tag(key, [data], offset=512) != good and tag(key, [data], crc=8) != good
    assert tag(key, [data], handle="h2") != good
    assert tag(possession.chunk_key(SECRET, b"m" * 16, "h"), [data]) != good  # another connection's key
    mac = possession.ChunkMac(key, "h", 0, len(data), 7)
    mac.update(bytes(flipped))
    with pytest.raises(PermissionDenied, match="MAC"):
        possession.check_tag(mac, good, "h", 0)


def test_a_tokens_secret_is_its_minting_keys_alone():
    key, other = CapabilityKey(b"k" * 32), CapabilityKey(b"o" * 32)
    token = key.sign(Capability("h", "o1", "src", "dst", 0, 100, 1e9))
    assert key.secret(token) == CapabilityKey(b"k" * 32).secret(token) != other.secret(token)
    assert key.secret(token) != key.secret(key.sign(Capability("h", "o2", "src", "dst", 0, 100, 1e9)))
    assert token.find(key.secret(token)) == -1  # the token does not carry its secret
