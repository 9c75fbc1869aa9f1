"""A tiny real Llama for the vLLM connector tests, made without the hub.

A LlamaForCausalLM config (4 layers, hidden 512, 8 heads, 4 KV heads, head
dim 64, a 2,048-token vocabulary) whose weights come from a seeded random
init, written with transformers' `save_pretrained` in float32 (bf16 is about
4x slower on these CPUs). The init is wider than transformers' default
(`INIT_STD`): with vLLM's `load_format="dummy"` weights, or too small an
init, attention is close to uniform and the greedy output hardly depends on
the KV, so exactness tests would pass vacuously; tests/e2e checks that noise
in the KV changes the output.

`tiny_llama(dir)` writes the model once into dir (keyed by the config and
seed) and returns its path; the same seed gives the same weights.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from hashlib import sha256
from pathlib import Path

INIT_STD = 0.08  # transformers' default 0.02 makes attention nearly uniform


@dataclass(frozen=True)
class TinyLlama:
    num_layers: int = 4
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 4
    intermediate: int = 1024
    vocab: int = 2048
    max_positions: int = 8192 + 256
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def key(self) -> str:
        return sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def tiny_llama(root: Path, spec: TinyLlama = TinyLlama()) -> Path:
    """The model's directory under root, written there first if absent."""
    path = Path(root) / f"tiny-llama-{spec.key()}"
    if (path / "config.json").exists() and any(path.glob("*.safetensors")):
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions, initializer_range=INIT_STD, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, torch_dtype="float32")
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tmp.rename(path)  # atomic: a concurrent or interrupted writer never leaves a half model
    return path
