"""speckv's block id of a vLLM block, from the id vLLM's KV events give it.
Pure: hashlib only, no vLLM import. Shared by the connector (which names the
blocks it saves) and the scheduler (which maps an engine's KV events), so
both name one block alike.

vLLM's block hash is a chain (parent hash, token ids, extra keys: LoRA,
cache salt, multimodal); its KV events publish it as an int, the low 64 bits
of the hash's big-endian value (vllm/v1/core/kv_cache_utils.py
maybe_convert_block_hash, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES on, the
default), or the whole bytes when that is off: `event_id` takes either to the
int. The chain names tokens, not KV bytes, so speckv's id also covers the
engine's layout digest (model, dtype, block size, layers, KV heads, head
dim, TP rank, page layout, hash algorithm: the connector's KVLayout):

    id = big-endian uint64 of the first 8 bytes of
         sha256(b"speckv-vllm-block/2" || layout digest || event id as 8 big-endian bytes)

Two blocks share an id only if their layouts and event ids are equal, or by
a 64-bit collision: among n distinct resident blocks about n^2 / 2^65 (1e6
blocks: ~3e-8), the bound speckv's uint64 ids have everywhere; vLLM's own
event ids carry the same bound. Id 0 is mapped to 1 (0 means "no parent" in
the kvstore protocol).
"""
from __future__ import annotations

import hashlib

DOMAIN = b"speckv-vllm-block/2"
DIGEST_BYTES = 32  # a layout digest is a sha256
_UINT64 = (1 << 64) - 1


def event_id(vllm_hash: bytes | int) -> int:
    """The int vLLM's KV events carry for a block hash (bytes: its low 64 bits, big-endian; an int: mod 2^64)."""
    if isinstance(vllm_hash, int):
        return vllm_hash & _UINT64
    return int.from_bytes(bytes(vllm_hash), "big") & _UINT64


def speckv_block_id(digest: bytes, vllm_event_id: int) -> int:
    """speckv's uint64 id of the block vLLM's events name vllm_event_id, in an engine of that layout digest."""
    h = hashlib.sha256(DOMAIN + digest + (vllm_event_id & _UINT64).to_bytes(8, "big")).digest()
    return int.from_bytes(h[:8], "big") or 1


def parse_digest(text: str) -> bytes:
    """A layout digest from its hex form (what the connector logs); ValueError when it is not 32 bytes of hex."""
    digest = bytes.fromhex(text.strip())
    if len(digest) != DIGEST_BYTES:
        raise ValueError(f"{len(digest)} bytes; a layout digest is {DIGEST_BYTES} (64 hex digits)")
    return digest
