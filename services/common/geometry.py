"""KV geometry of a node's pool: the shape of one block and its size in bytes.

A block holds the K and V of `block_size` consecutive tokens for every layer.
Its canonical byte layout (what PutBlocks/GetBlocks carry and what replication
chunks concatenate) is C order over

    [num_layers][2 (K, V)][block_size][num_kv_heads][head_dim]

so bytes_per_block = 2 * num_layers * block_size * num_kv_heads * head_dim *
itemsize, always derived, never configured.

NumPy has no bfloat16: a bfloat16 pool is stored as uint16 holding the raw
bf16 bit patterns. The store only moves bytes, so nothing ever needs the
arithmetic type; a GPU backend can view the same bits as a real bf16 type.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from speckv.services.common.errors import InvalidArgument

# dtype name -> NumPy storage dtype (bf16 kept as its uint16 bit pattern).
STORAGE_DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "float32": np.dtype(np.float32),
}


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """Immutable, validated on construction (InvalidArgument names the field)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int  # tokens per block
    name: str = ""  # preset name, "" for a custom geometry

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value <= 0:
                raise InvalidArgument(f"geometry.{field_name}={value!r}: must be a positive integer")
        if self.dtype not in STORAGE_DTYPES:
            raise InvalidArgument(
                f"geometry.dtype={self.dtype!r}: expected one of {', '.join(STORAGE_DTYPES)}")

    @property
    def storage_dtype(self) -> np.dtype:
        return STORAGE_DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return self.storage_dtype.itemsize

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """Canonical per-block shape: (layers, 2, block_size, heads, head_dim)."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def segment_bytes(self) -> int:
        """Bytes of one (layer, K-or-V) slab of a block: contiguous in the pool."""
        return self.block_size * self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def with_block_size(self, block_size: int) -> "KVGeometry":
        """The same model with another block size; 0 keeps the current one."""
        if block_size == 0:
            return self
        return replace(self, block_size=block_size)


# Published KV shapes (GQA: num_kv_heads is the number of KV heads, not of
# query heads). Blocks of 16 tokens like vLLM's default.
PRESETS: dict[str, KVGeometry] = {
    "llama-3-8b": KVGeometry(32, 8, 128, "bfloat16", 16, "llama-3-8b"),  # 2 MiB / block
    "llama-3-70b": KVGeometry(80, 8, 128, "bfloat16", 16, "llama-3-70b"),  # 5 MiB / block
    "qwen2.5-7b": KVGeometry(28, 4, 128, "bfloat16", 16, "qwen2.5-7b"),  # 896 KiB / block
    "tiny": KVGeometry(2, 2, 8, "float16", 4, "tiny"),  # 512 B / block, for tests
    # The real-engine tests' and benches' random Llama (loadgen/engines/tiny_llama.py) in vLLM's CPU build.
    "tiny-llama": KVGeometry(4, 4, 64, "float32", 32, "tiny-llama"),  # 256 KiB / block
}


def preset(name: str, block_size: int = 0) -> KVGeometry:
    """The named preset, with block_size overridden unless it is 0."""
    try:
        base = PRESETS[name]
    except KeyError:
        raise InvalidArgument(
            f"geometry={name!r}: unknown preset; expected one of {', '.join(PRESETS)}") from None
    if block_size < 0:
        raise InvalidArgument(f"block_size={block_size}: must be >= 0 (0 keeps the preset's)")
    return base.with_block_size(block_size)
