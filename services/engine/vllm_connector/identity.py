"""Which speckv block id a vLLM block has: vLLM's own block-hash chain under a
digest of the model and KV layout. Pure: hashlib only, no vLLM import.

vLLM hashes every full block of a request as H(parent hash, the block's token
ids, extra keys) where the extra keys carry the LoRA name, the cache salt
(first block), multimodal hashes and prompt-embedding hashes, and the first
block's parent is NONE_HASH (vllm/v1/core/kv_cache_utils.py:
hash_block_tokens, generate_block_hash_extra_keys). So one hash names one
whole prefix with its extra inputs. With the default sha256 hashes and
PYTHONHASHSEED unset, NONE_HASH comes from a fixed seed, so the chain is the
same in every engine process; with xxhash and no PYTHONHASHSEED vLLM picks a
random seed per process, and then nothing matches across processes (a miss,
never a wrong block).

The chain names tokens, not KV bytes: the same prefix under another model,
dtype, block size, layer count, KV head count, head dim, tensor-parallel rank
or page layout has other bytes. speckv's id is therefore

    id = big-endian uint64 of the first 8 bytes of
         sha256(b"speckv-vllm-block/1" || layout digest || vLLM block hash)

where the layout digest is sha256 over every field of KVLayout. Two blocks
share an id only if their layouts and vLLM hashes are equal, or by a 64-bit
collision: among n distinct resident blocks the chance of any collision is
about n^2 / 2^65 (1e6 blocks: ~3e-8), the same bound the kvstore's uint64
ids have everywhere; a block of another layout is never a candidate except
through such a collision. Id 0 is mapped to 1 (0 means "no parent" in the
kvstore protocol).

The ids are not vLLM's event ids (the low 64 bits of vLLM's hash): the
kvstore's own events carry these ids; an index joining vLLM's KV events with
the kvstore's must map vLLM's hashes through `block_id` with the engine's
digest.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Iterable

DOMAIN = b"speckv-vllm-block/1"


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Everything that decides a block's bytes besides its tokens. Units:
    block_size in tokens; head_dim in elements."""

    model: str  # the model's id (path or hub name, or the operator's model_id)
    dtype: str  # KV element type, e.g. "float32"
    block_size: int
    num_layers: int
    num_kv_heads: int  # per tensor-parallel rank
    head_dim: int
    tp_rank: int
    page_layout: str  # the engine's per-block page layout, e.g. "cpu:H,2,N,C"
    hash_algo: str  # vLLM's prefix_caching_hash_algo

    def digest(self) -> bytes:
        """sha256 over every field, in a fixed order and encoding."""
        fields = asdict(self)
        text = "\n".join(f"{name}={fields[name]}" for name in sorted(fields))
        return hashlib.sha256(text.encode()).digest()


def block_id(digest: bytes, vllm_hash: bytes) -> int:
    """speckv's uint64 id of one vLLM block hash under a layout digest (never 0)."""
    h = hashlib.sha256(DOMAIN + digest + bytes(vllm_hash)).digest()
    return int.from_bytes(h[:8], "big") or 1


def block_ids(digest: bytes, vllm_hashes: Iterable[bytes]) -> list[int]:
    return [block_id(digest, h) for h in vllm_hashes]
