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
or page layout has other bytes. speckv's id therefore covers a digest of the
layout (sha256 over every field of KVLayout) and is computed from the id
vLLM's own KV events give the block (services/common/vllm_block_ids.py), so
the scheduler maps an engine's events onto the same ids given its digest
(--kv-events ...,digest=HEX; the connector logs its digest at start).
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Iterable

from speckv.services.common.geometry import KVGeometry
from speckv.services.common.vllm_block_ids import event_id, speckv_block_id

CPU_PAGE_LAYOUT = "cpu:H,2,N,C"  # vLLM's CPU attention pages, as pages.py converts them
# vLLM's CUDA attention backends' pages (K and V halves of each token's content), as pages.py converts them.
# Another device's numerics give other bytes for the same tokens, so CPU and CUDA engines never share blocks.
CUDA_PAGE_LAYOUT = "cuda:H,N,2,C"
DEFAULT_HASH_ALGO = "sha256"  # vLLM's default prefix_caching_hash_algo: the chain starts from a fixed seed


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
    page_layout: str  # the engine's device and page kind, e.g. "cpu:H,2,N,C" (pages.PageKind)
    hash_algo: str  # vLLM's prefix_caching_hash_algo

    def digest(self) -> bytes:
        """sha256 over every field, in a fixed order and encoding."""
        fields = asdict(self)
        text = "\n".join(f"{name}={fields[name]}" for name in sorted(fields))
        return hashlib.sha256(text.encode()).digest()


def cpu_layout(model_id: str, geometry: KVGeometry) -> KVLayout:
    """The connector's layout in a CPU engine of this geometry (rank 0,
    sha256): its digest is what the scheduler's --kv-events digest= takes to
    index that engine's own events under the connector's ids. model_id: the
    connector's model_id setting, else the model as vLLM has it (--model)."""
    return KVLayout(model=model_id, dtype=geometry.dtype, block_size=geometry.block_size,
                    num_layers=geometry.num_layers, num_kv_heads=geometry.num_kv_heads, head_dim=geometry.head_dim,
                    tp_rank=0, page_layout=CPU_PAGE_LAYOUT, hash_algo=DEFAULT_HASH_ALGO)


def block_id(digest: bytes, vllm_hash: bytes) -> int:
    """speckv's uint64 id of one vLLM block hash under a layout digest (never 0)."""
    return speckv_block_id(digest, event_id(vllm_hash))


def block_ids(digest: bytes, vllm_hashes: Iterable[bytes]) -> list[int]:
    return [block_id(digest, h) for h in vllm_hashes]
