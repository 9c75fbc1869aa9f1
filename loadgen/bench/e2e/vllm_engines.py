"""The real engines of `speckv bench e2e --engine vllm`: one vLLM OpenAI
server per node (services/cluster/vllm_servers.py), SpeckvConnector loaded
onto the node's kvstore, the tiny random Llama of the connector tests
(loadgen/engines/tiny_llama.py) unless --model names another local model.

What changes with them (e2e/engines.py has the other kinds):
- Requests are scaled (vllm_jobs.py): one 32-token engine block per
  512-token trace block, 1/16 of the prompt and output tokens, prompts
  capped at max_model_len; block ids are the connector's ids of their
  tokens, so routes, events, the oracle and the ledger name the same blocks.
- The kvstores hold the model's own KV geometry (scale 1: every byte stored
  or replicated is the engine's KV), in a device tier of the committed
  config's pool_pages blocks. Each engine's own KV cache is
  ENGINE_KV_BLOCKS blocks, small enough that a slice overflows it, so what
  the engine reuses beyond its recent past comes through the connector.
- TTFT is the wall time of the real engine from the router's submit to the
  first streamed token (x the replay's speed: at speed 1, wall ms of this
  CPU), including contention with the services on the same cores.
- The warm start routes the pre-slice trace as for the emulated engines and
  runs the real prefill (one output token) of its newest requests on the
  node each was routed to, up to the config's warm_kv_fraction of the
  kvstores' pages.
- Each engine publishes its own KV events, which the scheduler indexes
  beside its node's kvstore (--kv-events ...,kvstore=1), so Route sees the
  engines' prefix caches as well as the kvstores, and probes its /health
  (health=), so an engine that dies leaves the index while its kvstore lives.
- A route's pull (fetch_from) is made by the node's connector: the request
  names the peer in kv_transfer_params, the peer's kvstore copies the blocks
  into the node's, and they load from there (docs/vllm_connector.md).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

from speckv.loadgen.engines.openai_stream import stream_completion
from speckv.loadgen.engines.vllm_jobs import VllmJobs, VllmPrompts, layout_digest
from speckv.loadgen.engines.vllm_server import VllmServerEngine
from speckv.services.cluster.ports import free_port
from speckv.services.cluster.vllm_servers import VllmServerSpec, start_servers, stop_server
from speckv.services.cluster.vllm_servers import model_geometry as server_model_geometry
from speckv.services.common.engine_profile import EngineProfile
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.traces import TraceRequest

BLOCK_TOKENS = 32  # vLLM's CPU attention needs a multiple of 32
MAX_MODEL_LEN = 4096  # 128 trace blocks scaled; a longer prompt loses trailing blocks
ENGINE_KV_BLOCKS = 256  # each engine's own cache: 8,192 tokens, 64 MiB of the tiny model's KV
START_BUDGET_S = 240.0  # the cluster, two vLLM servers (~30 s each alone, slower side by side), the warm prefill


@dataclass(frozen=True, slots=True)
class VllmModel:
    """The engines' model: its directory, its id in block ids (the
    directory's name, so ids do not depend on where it lies) and the
    prompts' scaling."""

    directory: Path
    model_id: str
    prompts: VllmPrompts
    events_ports: tuple[int, ...] = ()  # node-i's engine publishes its KV events on the i-th (with_events)
    http_ports: tuple[int, ...] = ()  # node-i's engine serves the OpenAI API (and /health) on the i-th


def with_events(model: VllmModel, nodes: int) -> VllmModel:
    """The model with a KV-event port and a server port per node (free now;
    every policy's run reuses them, one run at a time): the scheduler's flags
    name both before the engines start."""
    return replace(model, events_ports=tuple(free_port() for _ in range(nodes)),
                   http_ports=tuple(free_port() for _ in range(nodes)))


def scheduler_events(model: VllmModel, geometry: KVGeometry) -> list[str]:
    """The scheduler's flags indexing each engine's own KV events beside its
    node's kvstore (kvstore=1) under the connector's ids, each engine probed at
    its server's /health; none without ports."""
    if not model.events_ports:
        return []
    digest = layout_digest(model.model_id, geometry).hex()
    health = [f",health=http://127.0.0.1:{port}/health" for port in model.http_ports]
    return ["--kv-events", ";".join(f"node-{i}=tcp://127.0.0.1:{port},digest={digest},kvstore=1"
                                    f"{health[i] if i < len(health) else ''}"
                                    for i, port in enumerate(model.events_ports))]


def model_geometry(directory: Path) -> tuple[KVGeometry, int]:
    """(KV geometry, vocabulary size) of a local Hugging Face model directory."""
    geometry = server_model_geometry(directory, "float32", BLOCK_TOKENS)
    try:
        return geometry, int(json.loads((directory / "config.json").read_text())["vocab_size"])
    except (OSError, KeyError, ValueError, TypeError) as error:
        raise InvalidArgument(f"--model {directory}: cannot read its vocabulary size from config.json "
                              f"({error!r})") from None


def vllm_model(directory: Path | None, cache_root: Path) -> tuple[VllmModel, KVGeometry]:
    """The model (None: the tiny Llama, written once under cache_root)."""
    if directory is None:
        from speckv.loadgen.engines.tiny_llama import tiny_llama

        directory = tiny_llama(cache_root)
    geometry, vocab = model_geometry(directory)
    prompts = VllmPrompts(directory.name, geometry, vocab, MAX_MODEL_LEN)
    return VllmModel(directory, directory.name, prompts), geometry


def start_engines(model: VllmModel, addresses: Mapping[str, str], run_dir: Path, environ: Mapping[str, str],
                  speed: float) -> dict[str, VllmServerEngine]:
    """One healthy server per node (node i on core i mod cores), each as an
    engine whose close() also stops its server."""
    cores = os.cpu_count() or 1
    specs = [VllmServerSpec(f"vllm-{node}", str(model.directory), _http_port(model, node), address, core=i % cores,
                            max_model_len=MAX_MODEL_LEN, model_id=model.model_id, num_blocks=ENGINE_KV_BLOCKS,
                            node_id=node, peers=tuple((n, a) for n, a in sorted(addresses.items()) if n != node),
                            kv_events_endpoint=_events_endpoint(model, node))
             for i, (node, address) in enumerate(sorted(addresses.items()))]
    servers = start_servers(specs, run_dir, environ)
    engines: dict[str, VllmServerEngine] = {}
    for (spec, popen), node in zip(servers, sorted(addresses)):
        engines[node] = VllmServerEngine(node, spec.url, spec.served_model_name, speed,
                                         on_close=lambda popen=popen: stop_server(popen))
    return engines


def _http_port(model: VllmModel, node: str) -> int:
    """The port the scheduler's health= names for the node's engine (free_port() without one)."""
    index = int(node.rsplit("-", 1)[1])
    return model.http_ports[index] if index < len(model.http_ports) else free_port()


def _events_endpoint(model: VllmModel, node: str) -> str:
    index = int(node.rsplit("-", 1)[1])
    return f"tcp://*:{model.events_ports[index]}" if index < len(model.events_ports) else ""


def warm_prefill(engines: Mapping[str, VllmServerEngine], jobs: VllmJobs
                 ) -> Callable[[str, int, TraceRequest, int], int]:
    """The warm start's KV writer: the request's real prefill (one output
    token) on the node it was routed to; the connector saves its blocks."""
    def prefill(node: str, index: int, request: TraceRequest, first_block: int) -> int:
        job = jobs.make_job(f"warm-{index}", request, 1, None)  # type: ignore[arg-type]
        engine = engines[node]
        stream_completion(engine.url, engine.model_name, job.tokens, 1)
        return max(0, request.full_blocks - first_block)

    return prefill


def make_jobs(model: VllmModel, profile: EngineProfile) -> VllmJobs:
    return VllmJobs(model.prompts, profile)


def notes(model: VllmModel, geometry: KVGeometry, profile: EngineProfile) -> list[str]:
    return [
        f"Engine: vllm. One vLLM OpenAI server per node (the CPU build, one core each, eager, float32) running "
        f"{model.model_id} with SpeckvConnector on the node's kvstore; its own KV cache {ENGINE_KV_BLOCKS} blocks "
        f"of {BLOCK_TOKENS} tokens.",
        f"Tokens are scaled: each 512-token trace block is one {BLOCK_TOKENS}-token engine block (tokens drawn "
        f"from a generator seeded by the trace id), tails and outputs by the same 1/16, prompts capped at "
        f"{MAX_MODEL_LEN} tokens; block ids are the connector's ids of those tokens.",
        f"KV bytes are real (scale 1): {geometry.num_layers} layers x {geometry.num_kv_heads} KV heads x "
        f"{geometry.head_dim} dim x {geometry.dtype} = {geometry.bytes_per_block} B per block.",
        "TTFT is wall time of the real engine to its first streamed token (x the replay's speed), with the "
        "services on the same cores; a route's pull is made by the node's connector (the request names the peer "
        "in kv_transfer_params; the peer's kvstore copies the blocks into the node's, then they load); vLLM reports "
        "one figure for the prompt tokens it did not compute, so a pull's tokens are attributed: those beyond "
        "what Route said the node held, up to what it said the pull brings.",
        f"The scheduler prices with {profile.name} (fitted to this engine's prefill: {profile.source})",
    ]
