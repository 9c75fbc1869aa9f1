"""One vLLM engine (CPU, a local model, SpeckvConnector) in a child process,
for the real-engine tests and `speckv bench vllm`:
`python -m speckv.loadgen.engines.vllm_runner SPEC OUT`.

SPEC (JSON): model, kvstore (host:port; absent or empty: no connector), model_id, shared_memory, node_id,
peers, load_async and load_by_layer (optional: the connector's settings of those names), pull_from_each (optional, one node id per prompt
that its kv_transfer_params name to pull from, "" none), prompts (lists
of token ids), max_tokens (or max_tokens_each, one per prompt; generation
ignores EOS, so a prompt yields exactly that many), keep_cache (optional, one bool per prompt: keep
the engine's own prefix cache instead of emptying it first), max_model_len.
The engine generates each prompt greedily in turn (by default emptying its
own prefix cache first, so every prompt starts from what the kvstore holds)
and waits for its saves to reach the kvstore after each. OUT (JSON):
outputs (token ids per prompt), seconds (wall time of each generate call)
and the connector's counters.

The engine runs in the child's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0),
so the connector's counters are readable there; one core
(VLLM_CPU_OMP_THREADS_BIND), 1 GiB of KV (VLLM_CPU_KVCACHE_SPACE).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from speckv.loadgen.engines.tiny_llama import TinyLlama

BLOCK_SIZE = 32  # vLLM's CPU attention needs a multiple of 32
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
       "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
CONNECTOR_MODULE = "speckv.services.engine.vllm_connector.connector"


def prompt_block_ids(model: Path, spec: TinyLlama, tokens: list[int]) -> list[int]:
    """The speckv ids of the prompt's full blocks as the connector names them
    in an engine of run_engine's settings (float32, BLOCK_SIZE, sha256, the
    model path as its id), computed without an engine."""
    from speckv.loadgen.engines.vllm_jobs import chain_block_ids

    return chain_block_ids(str(model), _geometry(spec), tokens)


def engine_layout_digest(model: Path, spec: TinyLlama) -> bytes:
    """The layout digest of the connector in an engine of run_engine's settings."""
    from speckv.loadgen.engines.vllm_jobs import layout_digest

    return layout_digest(str(model), _geometry(spec))


def _geometry(spec: TinyLlama):
    from speckv.services.common.geometry import KVGeometry

    return KVGeometry(name="", num_layers=spec.num_layers, num_kv_heads=spec.kv_heads, head_dim=spec.head_dim,
                      dtype="float32", block_size=BLOCK_SIZE)


def run_engine(spec: dict[str, Any], workdir: Path, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run one engine on spec in a child process; its OUT as a dict."""
    spec_path, out_path = workdir / "spec.json", workdir / "out.json"
    spec_path.write_text(json.dumps(spec))
    out_path.unlink(missing_ok=True)
    env = {**os.environ, **ENV}
    env.pop("PYTHONHASHSEED", None)  # vLLM's sha256 chain then starts from its fixed seed in every process
    done = subprocess.run([sys.executable, "-m", "speckv.loadgen.engines.vllm_runner", str(spec_path), str(out_path)],
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"engine failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return json.loads(out_path.read_text())


def main(spec_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    from vllm.inputs import TokensPrompt

    from speckv.loadgen.engines.vllm_server import pull_params
    from speckv.services.engine.vllm_connector.counters import ALL_COUNTERS

    spec = json.loads(Path(spec_path).read_text())
    connected = bool(spec.get("kvstore"))  # no kvstore: the engine alone, without the connector
    extra = {"kvstore": spec.get("kvstore"), **({"model_id": spec["model_id"]} if spec.get("model_id") else {}),
             **({"shared_memory": spec["shared_memory"]} if "shared_memory" in spec else {}),
             **{key: spec[key] for key in ("node_id", "peers", "load_async", "load_by_layer") if key in spec}}
    max_len = spec.get("max_model_len", 4096)
    transfer = {"kv_connector": "SpeckvConnector", "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_both", "kv_load_failure_policy": spec.get("load_failure_policy", "recompute"),
                "kv_connector_extra_config": extra}
    events = spec.get("kv_events_port")  # also publish vLLM's own KV events there, and collect them
    # vLLM's PUB connects to a host:port endpoint (it binds only wildcard ones): the collector binds first.
    collector = EventCollector(f"tcp://127.0.0.1:{events}") if events else None
    llm = LLM(model=spec["model"], skip_tokenizer_init=True, enforce_eager=True, block_size=BLOCK_SIZE,
              dtype="float32", max_model_len=max_len, seed=0, max_num_batched_tokens=max_len,
              kv_transfer_config=transfer if connected else None,
              **({"kv_events_config": {"enable_kv_cache_events": True, "publisher": "zmq",
                                       "endpoint": f"tcp://127.0.0.1:{events}"}} if events else {}))
    keep = spec.get("keep_cache") or [False] * len(spec["prompts"])
    each = spec.get("max_tokens_each") or [spec.get("max_tokens", 8)] * len(spec["prompts"])
    pulls = spec.get("pull_from_each") or [""] * len(spec["prompts"])  # the peer each prompt names ("" none)
    outputs, seconds = [], []
    for prompt, keep_cache, max_tokens, pull_from in zip(spec["prompts"], keep, each, pulls):
        transfer_params = pull_params(pull_from)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False, ignore_eos=True,
                                extra_args={"kv_transfer_params": transfer_params} if transfer_params else None)
        if not keep_cache:
            llm.reset_prefix_cache()
        started = time.perf_counter()
        result = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        seconds.append(time.perf_counter() - started)
        outputs.append(list(result[0].outputs[0].token_ids))
        if connected:
            get_kv_transfer_group().flush()  # saves reach the kvstore before the next prompt asks for them
    totals: dict[str, float] = {}
    for counters in ALL_COUNTERS:
        for name, value in counters.snapshot().items():
            totals[name] = totals.get(name, 0) + value
    out = {"outputs": outputs, "seconds": seconds, "counters": totals}
    if collector is not None:
        out["vllm_stored"] = collector.stop()
    Path(out_path).write_text(json.dumps(out))


class EventCollector:
    """Subscribes to the engine's own KV events (vLLM's ZMQ publisher) and
    keeps the block ids of every BlockStored, as the scheduler decodes them
    (vllm_decode.py, no digest: vLLM's own event ids). It binds; the engine's
    publisher connects to it while starting, long before the first prompt."""

    def __init__(self, endpoint: str) -> None:
        import threading

        import zmq

        self._socket = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.bind(endpoint)
        self._stored: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        from speckv.services.scheduler.adapters.vllm_decode import VllmBatchDecoder, split_frames
        from speckv.services.scheduler.holder_index import HolderEventKind

        decoder = VllmBatchDecoder(BLOCK_SIZE)
        while not self._stop.is_set():
            if not self._socket.poll(100, zmq.POLLIN):
                continue
            sequence, payload = split_frames(self._socket.recv_multipart())
            for event in decoder.decode(sequence, payload).events:
                if event.kind is HolderEventKind.STORED:
                    self._stored.extend(event.block_hashes)

    def stop(self) -> list[int]:
        time.sleep(1.0)  # the publisher sends from its own thread
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)
        return list(self._stored)


if __name__ == "__main__":
    main(*sys.argv[1:3])
