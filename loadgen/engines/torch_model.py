"""A small GPT-style decoder in PyTorch (CPU, fp32, seeded random weights,
nothing downloaded) with an explicit KV cache whose blocks are the kvstore's
canonical block layout.

Architecture: token + learned position embeddings; `num_layers` pre-LayerNorm
blocks of grouped-query attention (num_heads query heads sharing
num_kv_heads K/V heads, num_kv_heads divides num_heads) and a GELU MLP (4 x
d_model); a final LayerNorm and an untied output head. fp32 throughout: bf16
runs several times slower than fp32 on CPUs without bf16 units
(docs/performance.md), and fp32 KV is stored bit for bit.

Determinism contract (why reused KV gives the very same tokens): the engine
feeds the model in chunks aligned to KV blocks (each chunk is one block of
`block_size` tokens starting at a multiple of block_size, or the prompt's
partial tail) and one token per decode step, one sequence per call. Every
token's K/V and logits are then computed by exactly the same sequence of
kernels on tensors of exactly the same shapes, whether the blocks before it
were computed here, read from this node's kvstore or replicated from
another node, so the results are bitwise equal (fp32 kernels are
deterministic for a given shape on one machine). Batching several sequences
into one call, or chunks of other sizes, would change shapes and may change
the last bits, hence argmax ties: the engine never does that.

Units: positions and lengths are tokens; the cache holds K and V per layer as
[capacity, num_kv_heads, head_dim] fp32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import KVGeometry


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape and seed of the model. head_dim = d_model / num_heads."""

    vocab_size: int = 512
    d_model: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "max_positions"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"model.{name}={getattr(self, name)}: must be > 0")
        if self.d_model % self.num_heads:
            raise InvalidArgument(f"model.num_heads={self.num_heads}: must divide d_model={self.d_model}")
        if self.num_heads % self.num_kv_heads:
            raise InvalidArgument(f"model.num_kv_heads={self.num_kv_heads}: must divide num_heads={self.num_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def kv_geometry(self, block_size: int) -> KVGeometry:
        """The kvstore geometry that holds this model's KV (custom: no preset name)."""
        return KVGeometry(self.num_layers, self.num_kv_heads, self.head_dim, "float32", block_size)

    def fingerprint(self) -> bytes:
        """Identifies the weights: salts block hashes so two models never share KV."""
        return repr((self.vocab_size, self.d_model, self.num_layers, self.num_heads, self.num_kv_heads,
                     self.max_positions, self.seed)).encode()


class KVCache:
    """K and V of one sequence, preallocated for `capacity` tokens.

    Invariant: positions [0, length) hold valid K/V; nothing else is read."""

    def __init__(self, spec: ModelSpec, capacity: int) -> None:
        if not 0 < capacity <= spec.max_positions:
            raise InvalidArgument(f"capacity={capacity}: must be 1..{spec.max_positions} tokens")
        shape = (spec.num_layers, capacity, spec.num_kv_heads, spec.head_dim)
        self.k = torch.zeros(shape, dtype=torch.float32)
        self.v = torch.zeros(shape, dtype=torch.float32)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def export_block(self, index: int, block_size: int) -> np.ndarray:
        """Block `index` in canonical layout [layers][2][block_size][kv_heads][head_dim], C order."""
        start, end = index * block_size, (index + 1) * block_size
        if end > self.length:
            raise InvalidArgument(f"block {index}: tokens {start}..{end} are not all in the cache ({self.length})")
        return torch.stack((self.k[:, start:end], self.v[:, start:end]), dim=1).contiguous().numpy()

    def import_blocks(self, blocks: list[np.ndarray], block_size: int) -> None:
        """Appends whole blocks (canonical layout, at a block-aligned length)."""
        if self.length % block_size:
            raise InvalidArgument(f"import at length {self.length}: not a multiple of block_size={block_size}")
        if self.length + len(blocks) * block_size > self.capacity:
            raise InvalidArgument(f"{len(blocks)} blocks do not fit a cache of {self.capacity} tokens")
        for block in blocks:
            # GetBlocks bytes give read-only arrays; torch wants writable memory.
            tensor = torch.from_numpy(block if block.flags.writeable else block.copy())
            end = self.length + block_size
            self.k[:, self.length:end] = tensor[:, 0]
            self.v[:, self.length:end] = tensor[:, 1]
            self.length = end


class _Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q = nn.Linear(spec.d_model, spec.d_model)
        self.kv = nn.Linear(spec.d_model, 2 * spec.num_kv_heads * spec.head_dim)
        self.out = nn.Linear(spec.d_model, spec.d_model)

    def forward(self, h: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        """h: [T, d_model] for positions [cache.length, cache.length + T)."""
        t, start = h.shape[0], cache.length
        q = self.q(h).view(t, self.heads, self.head_dim).transpose(0, 1)  # [H, T, D]
        k, v = self.kv(h).view(t, 2, self.kv_heads, self.head_dim).unbind(1)
        cache.k[layer, start:start + t] = k
        cache.v[layer, start:start + t] = v
        group = self.heads // self.kv_heads
        keys = cache.k[layer, :start + t].permute(1, 2, 0).repeat_interleave(group, dim=0)  # [H, D, S]
        values = cache.v[layer, :start + t].transpose(0, 1).repeat_interleave(group, dim=0)  # [H, S, D]
        scores = torch.matmul(q, keys) * (1.0 / math.sqrt(self.head_dim))  # [H, T, S]
        # Query i (absolute start + i) sees keys 0..start + i.
        visible = torch.arange(start + t)[None, :] <= (start + torch.arange(t))[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        mixed = torch.matmul(torch.softmax(scores, dim=-1), values)  # [H, T, D]
        return self.out(mixed.transpose(0, 1).reshape(t, self.heads * self.head_dim))


class _Block(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(spec.d_model), nn.LayerNorm(spec.d_model)
        self.attn = _Attention(spec)
        self.mlp = nn.Sequential(nn.Linear(spec.d_model, 4 * spec.d_model), nn.GELU(),
                                 nn.Linear(4 * spec.d_model, spec.d_model))

    def forward(self, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache, layer)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """The decoder. Weights are drawn from a torch.Generator seeded with
    spec.seed, so every process building the same spec holds the same model."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.tokens = nn.Embedding(spec.vocab_size, spec.d_model)
        self.positions = nn.Embedding(spec.max_positions, spec.d_model)
        self.blocks = nn.ModuleList(_Block(spec) for _ in range(spec.num_layers))
        self.ln_f = nn.LayerNorm(spec.d_model)
        self.head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        self._init_weights(torch.Generator().manual_seed(spec.seed))
        self.eval()

    def _init_weights(self, generator: torch.Generator) -> None:
        # Layer matrices N(0, 1/fan_in): untrained, GPT-2's N(0, 0.02) leaves
        # attention so weak that the next token hardly depends on the context
        # (zeroing a 200-token prompt's cached KV left the next 10 greedy
        # tokens unchanged for 16 prompts in 20), and "same tokens" would
        # prove little about the KV; with 1/fan_in it changed all 20.
        # A wider head so that greedy picks are decided by clear margins.
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("bias"):
                    param.zero_()
                elif "ln" in name:
                    param.fill_(1.0)
                else:
                    std = 0.5 if name.startswith("head") else param.shape[1] ** -0.5 if "blocks" in name else 1.0
                    param.copy_(torch.randn(param.shape, generator=generator) * std)

    @torch.inference_mode()
    def forward_chunk(self, tokens: list[int] | torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Runs `tokens` at positions [cache.length, ...), writes their K/V into
        the cache and returns the last token's logits [vocab_size]."""
        ids = torch.as_tensor(tokens, dtype=torch.long)
        t, start = ids.shape[0], cache.length
        if t == 0 or start + t > cache.capacity:
            raise InvalidArgument(f"chunk of {t} tokens at {start}: cache holds {cache.capacity}")
        x = self.tokens(ids) + self.positions(torch.arange(start, start + t))
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)
        cache.length = start + t
        return self.head(self.ln_f(x[-1:]))[0]
