"""One vLLM engine (CPU, the tiny Llama, SpeckvConnector) in a child process,
for the real-engine tests: `python -m tests.support.vllm_engine SPEC OUT`.

SPEC (JSON): model, kvstore (host:port), model_id (optional), prompts (lists
of token ids), max_tokens. The engine generates each prompt greedily in turn,
emptying its own prefix cache before each, so every prompt starts from what
the kvstore holds; then it waits for its saves to reach the kvstore. OUT
(JSON): outputs (token ids per prompt) and the connector's counters.

The engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the
connector's counters are readable here; one core (VLLM_CPU_OMP_THREADS_BIND),
1 GiB of KV (VLLM_CPU_KVCACHE_SPACE).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

BLOCK_SIZE = 32  # vLLM's CPU attention needs a multiple of 32
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
       "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
CONNECTOR_MODULE = "speckv.services.engine.vllm_connector.connector"


def run_engine(spec: dict[str, Any], workdir: Path, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run one engine on spec in a child process; its OUT as a dict."""
    spec_path, out_path = workdir / "spec.json", workdir / "out.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    env = {**os.environ, **ENV}
    env.pop("PYTHONHASHSEED", None)  # vLLM's sha256 chain then starts from its fixed seed in every process
    done = subprocess.run([sys.executable, "-m", "tests.support.vllm_engine", str(spec_path), str(out_path)],
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"engine failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return json.loads(out_path.read_text())


def main(spec_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from speckv.services.engine.vllm_connector.counters import ALL_COUNTERS

    spec = json.loads(Path(spec_path).read_text())
    extra = {"kvstore": spec["kvstore"], **({"model_id": spec["model_id"]} if spec.get("model_id") else {})}
    llm = LLM(model=spec["model"], skip_tokenizer_init=True, enforce_eager=True, block_size=BLOCK_SIZE,
              dtype="float32", max_model_len=spec.get("max_model_len", 4096), seed=0,
              max_num_batched_tokens=spec.get("max_model_len", 4096),
              kv_transfer_config={"kv_connector": "SpeckvConnector", "kv_connector_module_path": CONNECTOR_MODULE,
                                  "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                                  "kv_connector_extra_config": extra})
    params = SamplingParams(max_tokens=spec.get("max_tokens", 8), temperature=0.0, detokenize=False)
    outputs = []
    for prompt in spec["prompts"]:
        llm.reset_prefix_cache()
        result = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        outputs.append(list(result[0].outputs[0].token_ids))
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    get_kv_transfer_group().flush()
    totals: dict[str, int] = {}
    for counters in ALL_COUNTERS:
        for name, value in counters.snapshot().items():
            totals[name] = totals.get(name, 0) + value
    Path(out_path).write_text(json.dumps({"outputs": outputs, "counters": totals}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
