"""The engines of one end-to-end comparison (`speckv bench e2e --engine`) and
everything that differs with them: what the kvstores hold, the unit requests
are counted in, how the warm start writes KV, and how bytes are reported.

- emulated (default): EmulatedEngine on the committed profile; the kvstores
  hold config.store_geometry, the real model's bytes scaled down by
  config.byte_scale; the router stores deterministic synthetic payloads.
- vllm: real vLLM OpenAI servers with SpeckvConnector (e2e/vllm_engines.py
  says what changes with them).
- torch: one TinyGPT (ModelSpec(): seeded random weights, fp32, on the CPU,
  nothing downloaded) behind every node; the kvstores hold the model's own
  geometry at TORCH_BLOCK_TOKENS per block, so every byte stored, pulled or
  replicated is real KV (scale 1). Requests are rewritten into model tokens
  before anything sees them (torch_kv.model_scale: one 16-token block per
  512-token trace block, i.e. 1/32 of the trace's prompt and output tokens,
  ids kept), so routes, heartbeats and the engine count the same tokens.
  The engine reads and writes its KV itself; the warm start runs the real
  prefill of the newest pre-slice requests, capped at TORCH_WARM_KV_BLOCKS
  blocks (the emulated run's 3,600 would take another 20-40 s here).

Torch time: the engine clock is trace time and a step lasts its measured
duration x the replay's speed, so the engine keeps pace with the wall clock
the trace is compressed onto: its TTFTs are trace-time ms, i.e. wall ms of
this CPU x speed (equal at --speed 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import grpc

from speckv.loadgen.engines.emulated import EmulatedEngine, Engine
from speckv.loadgen.experiments.e2e_config import E2EConfig
from speckv.loadgen.experiments.reference_router import EmulatedJobs, JobFactory, Placement
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.traces import TraceRequest

if TYPE_CHECKING:
    from speckv.loadgen.bench.e2e.vllm_engines import VllmModel
    from speckv.loadgen.engines.torch_model import ModelSpec

ENGINES = ("emulated", "torch", "vllm")
TORCH_BLOCK_TOKENS = 16
TORCH_WARM_KV_BLOCKS = 800
# Wall seconds for the cluster start plus the warm start (the replay origin
# is fixed before launch: e2e/run.py); the torch warm start also computes
# its KV, and the emulated one routes the warm-up requests (in batches; the
# newest, whose KV is stored, one at a time). The budget is about twice what
# the quick slice's warm start takes on a quiet machine (docs/performance.md,
# "Warm start"), so other work on the cores does not make it late.
START_BUDGET_S = {"emulated": 40.0, "torch": 40.0}  # vllm: vllm_engines.START_BUDGET_S

# (node, index in the warm list, request, first block not cached there) -> blocks stored
StoreKV = Callable[[str, int, TraceRequest, int], int]


@dataclass(frozen=True, slots=True)
class EngineSetup:
    """One comparison's engine kind. Bytes: stored bytes x byte_scale =
    reported bytes; real_bytes_per_block is what one kvstore block counts
    for in the results."""

    kind: str
    geometry: KVGeometry  # what every kvstore holds
    byte_scale: int
    real_bytes_per_block: int
    start_budget_s: float
    warm_kv_blocks: int  # most distinct blocks the warm start stores, cluster-wide
    spec: ModelSpec | None = None  # the torch engine's model
    vllm: VllmModel | None = None  # the vLLM engines' model and prompts

    def cluster_geometry(self) -> tuple[str, int, list[str]]:
        """(kvstore preset, block size, override flags) that make self.geometry."""
        if self.geometry.name:
            return self.geometry.name, self.geometry.block_size, []
        g = self.geometry
        return "tiny", g.block_size, ["--num-layers", str(g.num_layers), "--num-kv-heads", str(g.num_kv_heads),
                                      "--head-dim", str(g.head_dim), "--dtype", g.dtype]

    def scale(self, requests: Sequence[TraceRequest]) -> list[TraceRequest]:
        """The requests in the engine's tokens (unchanged when emulated)."""
        if self.vllm is not None:
            return self.vllm.prompts.scale(requests)
        if self.spec is None:
            return list(requests)
        from speckv.loadgen.engines.torch_kv import model_scale

        return [model_scale(r, self.geometry.block_size, self.spec.max_positions) for r in requests]


def engine_setup(config: E2EConfig, kind: str = "emulated", model_dir: Path | None = None,
                 cache_root: Path | None = None) -> EngineSetup:
    """model_dir: the vllm engines' model (None: the tiny Llama, written
    under cache_root)."""
    if kind == "emulated":
        return EngineSetup(kind, config.scaled_geometry, config.byte_scale, config.real_bytes_per_block,
                           START_BUDGET_S[kind],
                           int(config.warm_kv_fraction * config.nodes * (config.pool_pages + config.host_pages)))
    if kind == "torch":
        from speckv.loadgen.engines.torch_model import ModelSpec

        spec = ModelSpec()
        geometry = spec.kv_geometry(TORCH_BLOCK_TOKENS)
        warm = min(TORCH_WARM_KV_BLOCKS, int(config.warm_kv_fraction * config.nodes * config.pool_pages))
        return EngineSetup(kind, geometry, 1, geometry.bytes_per_block, START_BUDGET_S[kind], warm, spec)
    if kind == "vllm":
        from speckv.loadgen.bench.e2e import vllm_engines

        model, geometry = vllm_engines.vllm_model(model_dir, cache_root or Path.home() / ".cache" / "speckv")
        return EngineSetup(kind, geometry, 1, geometry.bytes_per_block, vllm_engines.START_BUDGET_S,
                           int(config.warm_kv_fraction * config.nodes * config.pool_pages),
                           vllm=vllm_engines.with_events(model, config.nodes))
    raise InvalidArgument(f"--engine={kind!r}: expected one of {', '.join(ENGINES)}")


def build_engines(setup: EngineSetup, config: E2EConfig, kv_channels: Mapping[str, grpc.Channel],
                  speed: float, addresses: Mapping[str, str] | None = None, run_dir: Path | None = None,
                  environ: Mapping[str, str] | None = None) -> tuple[dict[str, Engine], JobFactory, StoreKV | None]:
    """Engines per node, the router's job factory, and the warm start's KV
    writer (None: the warm start's synthetic payloads). addresses, run_dir,
    environ: the kvstores' addresses, the run's folder and environment (the
    vllm engines' servers need them). Engines with a close() are the
    caller's to close."""
    if setup.vllm is not None:
        from speckv.loadgen.bench.e2e import vllm_engines

        if addresses is None or run_dir is None or environ is None:
            raise ValueError("vllm engines need the kvstores' addresses, a run folder and an environment")
        servers = vllm_engines.start_engines(setup.vllm, addresses, run_dir, environ, speed)
        vllm_jobs = vllm_engines.make_jobs(setup.vllm, config.profile)
        return dict(servers), vllm_jobs, vllm_engines.warm_prefill(servers, vllm_jobs)
    if setup.spec is None:
        engines: dict[str, Engine] = {n: emulated_engine(config, n) for n in kv_channels}
        return engines, EmulatedJobs(config.profile, config.real_geometry.bytes_per_token), None
    import torch

    from speckv.loadgen.engines.torch_engine import TorchJobs, build_torch_engines

    # The cores are shared with six service processes and the router's
    # threads: a second intra-op thread spins against them and makes each
    # call several times slower (docs/performance.md, "Torch threads").
    torch.set_num_threads(1)
    torch_engines = build_torch_engines(kv_channels, setup.spec, setup.geometry.block_size, time_scale=speed)
    jobs = TorchJobs(setup.spec, setup.geometry.block_size)

    def prefill(node: str, index: int, request: TraceRequest, first_block: int) -> int:
        # The engine itself reuses what its node holds: first_block is only the route's view.
        job = jobs.make_job(f"warm-{index}", request, 0, Placement(node, 0, 0, ""))
        engine = torch_engines[node]
        engine.submit(job, 0.0)
        engine.advance(float("inf"))
        return job.stored_blocks

    return dict(torch_engines), jobs, prefill


def emulated_engine(config: E2EConfig, node: str) -> EmulatedEngine:
    """One node's emulated engine (also a node added during a run)."""
    host_link = config.host_link if config.host_pages else None
    return EmulatedEngine(node, config.profile, config.engine, config.link, config.real_geometry.bytes_per_token,
                          host_link)


def engine_notes(setup: EngineSetup, config: E2EConfig) -> list[str]:
    if setup.vllm is not None:
        from speckv.loadgen.bench.e2e import vllm_engines

        return vllm_engines.notes(setup.vllm, setup.geometry, config.profile)
    if setup.spec is None:
        return [
            f"Engines emulate {config.profile.model} on {config.profile.hardware} (profile {config.profile.name}, "
            f"measured={config.profile.measured}); TTFT is in that model's time.",
            f"KV bytes are scaled down by {config.byte_scale} (kvstore geometry {config.store_geometry} at "
            f"{config.block_tokens} tokens/block) and every emulated link by the same factor; bytes reported are "
            "the real model's.",
        ]
    s, g = setup.spec, setup.geometry
    return [
        f"Engine: torch. A real decoder (TinyGPT: {s.num_layers} layers, d_model {s.d_model}, {s.num_heads} heads, "
        f"{s.num_kv_heads} KV heads, vocab {s.vocab_size}, seed {s.seed}, fp32, PyTorch on this CPU, one "
        "intra-op thread, seeded random weights, nothing downloaded) serves every node; its prefill writes its "
        "real KV into the node's kvstore and reuses cached, pulled and replicated KV bit for bit.",
        f"Tokens are scaled: each {config.block_tokens}-token trace block is one {g.block_size}-token model block "
        f"(same id; tokens drawn from a generator seeded by the id), partial tails and outputs by the same "
        f"{g.block_size}/{config.block_tokens}, prompts capped at the model's {s.max_positions} positions; the "
        "scheduler, heartbeats and records count model tokens.",
        f"KV bytes are real (byte scale factor 1): kvstore geometry {g.num_layers} layers x {g.num_kv_heads} KV "
        f"heads x {g.head_dim} dim x {g.dtype} at {g.block_size} tokens/block = {g.bytes_per_block} B per block; "
        f"links are the config's {config.link.gbps:g} Gbit/s unscaled.",
        "TTFT is trace-time ms of TinyGPT on this CPU: the measured duration of each engine step x the replay's "
        "speed (the engine keeps pace with the compressed wall clock), so it includes contention with the "
        "services on the same cores.",
        f"The scheduler still routes and plans with the committed profile {config.profile.name} (prefill and "
        "queue estimates of the emulated model, applied to model tokens): it does not describe this engine's "
        "prefill times, and on prompts scaled to 1/32 it prices most prefixes below the planner's "
        "min_benefit_ms, so few or no replication orders pass its benefit test.",
    ]
