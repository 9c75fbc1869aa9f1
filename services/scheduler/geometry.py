"""KV geometry of a node: how many bytes one block occupies.

bytes_per_block = 2 (K and V) * num_layers * num_kv_heads * head_dim *
block_size * dtype size. Llama-3-8B (32 layers, 8 KV heads, head_dim 128,
bf16) is 128 KiB per token, so 2 MiB per 16-token block.
"""
from __future__ import annotations

from dataclasses import dataclass

from speckv.services.common.errors import InvalidArgument

DTYPE_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True, slots=True)
class Geometry:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int  # tokens per block
    name: str = ""

    def validate(self, where: str = "geometry") -> None:
        for field_name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, field_name)
            if value <= 0:
                raise InvalidArgument(f"{where}.{field_name}={value}: must be > 0")
        if self.dtype not in DTYPE_BYTES:
            raise InvalidArgument(
                f"{where}.dtype={self.dtype!r}: expected one of {', '.join(sorted(DTYPE_BYTES))}")

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size
