"""`speckv bench vllm [--quick] [--json [PATH]]`: how long a real vLLM engine
takes to its first token on a long prompt whose prefix it recomputes, loads
from the node's kvstore through SpeckvConnector, or finds in its own prefix
cache; beside NumPy memcpy of the same bytes, measured in the same run.

Set-up: one kvstore process on loopback holding the engine's geometry, one
vLLM engine (CPU build, one core, float32, blocks of 32 tokens) on the tiny
random Llama of loadgen/engines/tiny_llama.py (4 layers, hidden 512, 4 KV
heads of 64: 8 KiB of KV per token), written once under --model-dir. The
scale: a small CPU model, so the absolute seconds say little about a GPU
engine; the ratios are the figures.

In one engine, prompts in turn (each generates 1 token, greedy): a short
warm-up prompt; the long prompt P with the kvstore empty (recompute; the
connector saves its blocks); P again with the engine's own prefix cache
emptied (its prefix loaded from the kvstore); P again keeping that cache
(vLLM's own prefix cache). Seconds are the wall time of each generate call.
`tokens_identical`: the three answers to P agree (tests/e2e checks 16 tokens).
`connector_load_gbps`: bytes loaded / the worker's load time (GetBlocks over
gRPC, crc32c, scatter into the pages); `memcpy_gbps`: np.copyto of as many
bytes. Targets (issue 41, not asserted): load_over_recompute_8k <= 0.1,
connector load >= 0.5x memcpy. Bytes move over gRPC for now; same-host
shared memory is issue 42.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from speckv.loadgen.bench.transfer import ceilings
from speckv.loadgen.bench.transfer.procs import start_kvstore
from speckv.loadgen.engines.tiny_llama import TinyLlama, tiny_llama
from speckv.loadgen.engines.vllm_runner import BLOCK_SIZE, run_engine

DEFAULT_MODEL_DIR = Path(tempfile.gettempdir()) / "speckv-models"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="speckv bench vllm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 2k-token prompt instead of 8k")
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                        help="write the results as JSON to PATH (stdout without PATH)")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR, help="where the tiny model is written once")
    return parser.parse_args(argv)


def measure(prompt_blocks: int, model_dir: Path) -> dict[str, Any]:
    spec = TinyLlama()
    model = tiny_llama(model_dir, spec)
    rng = np.random.default_rng(11)
    prompt = [int(t) for t in rng.integers(3, spec.vocab, prompt_blocks * BLOCK_SIZE + 1)]
    warm = [int(t) for t in rng.integers(3, spec.vocab, 8 * BLOCK_SIZE + 1)]
    args = ["--geometry", "tiny", "--block-size", str(BLOCK_SIZE), "--num-layers", str(spec.num_layers),
            "--num-kv-heads", str(spec.kv_heads), "--head-dim", str(spec.head_dim), "--dtype", "float32",
            "--device-pages", str(prompt_blocks + 64)]
    store = start_kvstore("bench-vllm", args)
    try:
        with tempfile.TemporaryDirectory(prefix="speckv-bench-vllm-") as workdir:
            out = run_engine({"model": str(model), "kvstore": store.address, "max_tokens": 1,
                              "max_model_len": len(prompt) + 64, "prompts": [warm, prompt, prompt, prompt],
                              "keep_cache": [False, False, False, True]}, Path(workdir), timeout_s=1200.0)
    finally:
        store.stop()
    _, recompute_s, loaded_s, cached_s = out["seconds"]
    counters = out["counters"]
    loaded_bytes = counters["bytes_loaded"]
    tokens = len(prompt)
    label = f"{tokens // 1024}k" if tokens >= 1024 else str(tokens)  # 2049 tokens: "2k", as the targets
    return {
        "prompt_tokens": tokens, "block_tokens": BLOCK_SIZE, "model": "tiny random Llama (4 layers, hidden 512, "
        "4 KV heads x 64, float32), vLLM 0.32 CPU, 1 core", "recompute_s": recompute_s, "loaded_s": loaded_s,
        "prefix_cache_s": cached_s, f"load_over_recompute_{label}": loaded_s / recompute_s,
        f"prefix_cache_over_recompute_{label}": cached_s / recompute_s,
        "tokens_identical": out["outputs"][1] == out["outputs"][2] == out["outputs"][3],
        "blocks_loaded": counters["blocks_loaded"], "blocks_saved": counters["blocks_saved"],
        "connector_load_s": counters["load_seconds"],
        "connector_load_gbps": loaded_bytes / counters["load_seconds"] / 1e9 if counters["load_seconds"] else 0.0,
        "memcpy_gbps": ceilings.memcpy_gbps(max(loaded_bytes, 1 << 20), repeats=3),
        "failures": {k: counters[k] for k in ("lookup_failures", "load_failures", "save_failures")},
    }


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    options = parse(argv)
    result = measure(64 if options.quick else 256, options.model_dir)
    text = json.dumps(result, indent=2)
    if options.json == "-":
        print(text)
    else:
        for key, value in result.items():
            print(f"{key:34s} {value:.4g}" if isinstance(value, float) else f"{key:34s} {value}")
        if options.json:
            Path(options.json).write_text(text + "\n")
    return 0
