"""`speckv bench vllm --fit-profile`: the emulated engine's profile fitted to
the real engine on this machine (issue 41, item 4), so the simulator and the
emulated cluster time prefill as vLLM does here.

Measured in one vLLM engine (CPU build, one core, float32, the tiny random
Llama of loadgen/engines/tiny_llama.py, no connector), its prefix cache
emptied before each prompt: after a warm-up, `repeats` distinct prompts of
each size in SIZES generating one token (the wall time of that generate call
is the prefill: the first token comes out of the prefill's logits), the
median per size; then, at two sizes, one token against 1 + DECODE_TOKENS
tokens, the difference over DECODE_TOKENS being a decode step of one
sequence. Fitted (loadgen/profiles/fit.py prefill_held_out) on alternate
sizes, the error reported on the others: prefill_ms(n) = overhead_ms +
ms_per_token * n + ms_per_token_pair * n (n + 1) / 2, the form of every
profile in services/config/engine_profiles.json.
"""
from __future__ import annotations

import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from speckv.loadgen.engines.tiny_llama import TinyLlama, tiny_llama
from speckv.loadgen.engines.vllm_runner import BLOCK_SIZE, run_engine
from speckv.loadgen.profiles.fit import prefill_held_out

SIZES = (128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
QUICK_SIZES = (128, 256, 512, 768, 1024, 1536, 2048)
DECODE_SIZES = (512, 2048)
DECODE_TOKENS = 32


def measure_profile(model_dir: Path, quick: bool = False, repeats: int = 2) -> dict[str, Any]:
    spec = TinyLlama()
    model = tiny_llama(model_dir, spec)
    sizes = QUICK_SIZES if quick else SIZES
    rng = np.random.default_rng(31)
    tokens = lambda n: [int(t) for t in rng.integers(3, spec.vocab, n)]  # noqa: E731
    prompts, limits = [tokens(256)], [1]  # warm-up
    for n in sizes:
        prompts += [tokens(n) for _ in range(repeats)]
        limits += [1] * repeats
    decode_at = [n for n in DECODE_SIZES if n <= max(sizes)]
    for n in decode_at:
        prompts += [tokens(n), tokens(n)]
        limits += [1, 1 + DECODE_TOKENS]
    with tempfile.TemporaryDirectory(prefix="speckv-profile-vllm-") as workdir:
        out = run_engine({"model": str(model), "max_model_len": max(sizes) + DECODE_TOKENS + 64, "prompts": prompts,
                          "max_tokens_each": limits}, Path(workdir), timeout_s=1800.0)
    seconds = out["seconds"][1:]
    prefill_ms = [1e3 * statistics.median(seconds[i * repeats:(i + 1) * repeats]) for i in range(len(sizes))]
    rest = seconds[len(sizes) * repeats:]
    decode_ms = [1e3 * (rest[2 * i + 1] - rest[2 * i]) / DECODE_TOKENS for i in range(len(decode_at))]
    fit, error = prefill_held_out(np.array(sizes), np.array(prefill_ms))
    return {"sizes": list(sizes), "prefill_ms": prefill_ms, "repeats": repeats,
            "decode": {"at_tokens": decode_at, "step_ms": decode_ms},
            "fit": {"overhead_ms": fit.overhead_ms, "ms_per_token": fit.ms_per_token,
                    "ms_per_token_pair": fit.ms_per_token_pair},
            "held_out_error": error.to_json(), "profile": _entry(spec, fit, error, decode_ms, quick)}


def _entry(spec: TinyLlama, fit, error, decode_ms: list[float], quick: bool) -> dict[str, Any]:
    """An engine_profiles.json entry (measured: true) for this engine here."""
    command = "speckv bench vllm --fit-profile" + (" --quick" if quick else "")
    return {
        "model": "tiny random Llama (loadgen/engines/tiny_llama.py)",
        "hardware": f"1 core of {platform.processor() or platform.machine()}, vLLM 0.32 CPU build, float32",
        "overhead_ms": round(fit.overhead_ms, 3), "ms_per_token": round(fit.ms_per_token, 6),
        "ms_per_token_pair": fit.ms_per_token_pair,
        "geometry": {"num_layers": spec.num_layers, "num_kv_heads": spec.kv_heads, "head_dim": spec.head_dim,
                     "dtype": "float32", "block_size": BLOCK_SIZE},
        "measured": True,
        "source": f"Fitted by `{command}` on {time.strftime('%Y-%m-%d')} to the real engine's prefill on this "
                  f"machine (one generate call of one token per prompt, prefix cache emptied); held-out relative "
                  f"error mean {error.mean:.3f}, max {error.max:.3f} (at {error.worst} tokens).",
        "decode": {"step_ms": round(statistics.mean(decode_ms), 3) if decode_ms else None, "batch": 1},
    }
