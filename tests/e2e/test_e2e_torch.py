"""`speckv bench e2e --engine torch`: a short live comparison on real
services with the real PyTorch engine, through the CLI's code path
(e2e.compare with the torch engine setup).

The slice [450, 458) s of the conversation trace holds the trace's only
conversation turn that returns within seconds (at 453 and 456 s). The
cluster is the committed one shrunk for test time (2 nodes, 150 s of
warm-up, a 15 s start budget, 200 warm blocks), and `reactive-heat` gets a
policies file that replicates any family seen once, so real KV does cross
between kvstores; what a `--config` file could set, nothing else. Asserted:
every request served with its tokens, the kvstores hold the model's KV
geometry, replicated bytes are real, and every request that reused KV
(cached, pulled or replicated) produced exactly the tokens of a recompute
from scratch. Nothing about times.
"""
from __future__ import annotations

import dataclasses

from rich.console import Console

from speckv.loadgen.bench.e2e import cli as e2e
from speckv.loadgen.bench.e2e.engines import TORCH_BLOCK_TOKENS, engine_setup
from speckv.loadgen.engines.torch_engine import TorchEngine, TorchJob
from speckv.loadgen.engines.torch_kv import CoreBlockStore
from speckv.loadgen.engines.torch_model import ModelSpec, TinyGPT
from speckv.loadgen.experiments.e2e_config import SliceSpec, load_e2e_config
from speckv.services.common.clock import ManualClock
from speckv.services.kvstore.store import KVStoreCore
from tests.support.eager_heat import eager_heat_policies

POLICIES = ["none", "reactive-heat"]
SLICE = SliceSpec(450.0, 8.0, 2.0)


def _config(tmp_path):
    path = eager_heat_policies(tmp_path)
    config = load_e2e_config()
    return dataclasses.replace(config, nodes=2, warmup_s=150.0,
                               extra_args={**config.extra_args, "scheduler": ["--policies-path", str(path)]})


def _recompute(model: TinyGPT, job: TorchJob) -> list[int]:
    """The job's tokens on an engine whose kvstore is empty: every token computed."""
    geometry = model.spec.kv_geometry(TORCH_BLOCK_TOKENS)
    engine = TorchEngine("fresh", model, CoreBlockStore(KVStoreCore("fresh", geometry, 512, ManualClock(0.0))),
                         TORCH_BLOCK_TOKENS)
    fresh = TorchJob(job.request_id, job.prompt_tokens, job.output_tokens, tokens=job.tokens,
                     block_hashes=job.block_hashes)
    engine.submit(fresh, 0.0)
    engine.advance(float("inf"))
    assert fresh.computed_tokens == len(fresh.tokens)
    return fresh.output_ids


def test_torch_engine_comparison_serves_real_kv_exactly(tmp_path, traces_dir):
    config = _config(tmp_path)
    setup = dataclasses.replace(engine_setup(config, "torch"), start_budget_s=15.0, warm_kv_blocks=200)
    comparison, runs = e2e.compare(traces_dir / "mooncake_conversation_trace.jsonl", POLICIES, config, SLICE, {},
                                   Console(quiet=True), quick=True, setup=setup)
    result = comparison.to_json()
    spec = ModelSpec()
    block_bytes = spec.kv_geometry(TORCH_BLOCK_TOKENS).bytes_per_block
    assert (result["engine"], result["byte_scale_factor"], result["real_bytes_per_block"]) == ("torch", 1, block_bytes)

    model = TinyGPT(spec)
    for policy in POLICIES:
        run, metrics = runs[policy], result["policies"][policy]
        assert metrics["requests"] == metrics["served"] == len(run.jobs) > 0 and metrics["errors"] == 0
        jobs = list(run.jobs.values())
        for job in jobs:
            assert isinstance(job, TorchJob) and len(job.output_ids) == job.output_tokens >= 1
            skipped = (job.reused_blocks + job.fetched_blocks) * TORCH_BLOCK_TOKENS
            assert job.computed_tokens + skipped == len(job.tokens)
        assert sum(job.stored_blocks for job in jobs) > 0
        for stats in run.kvstores.values():
            assert stats.geometry.bytes_per_block == block_bytes and stats.geometry.dtype == "float32"
            assert stats.used_pages > 0

        reusing = [job for job in jobs if job.reused_blocks or job.fetched_blocks]
        assert reusing, "no request reused KV: the shared system prompt block alone should be reused"
        served_by_replica = {r.request_id for r in run.records if r.replica_blocks}
        assert served_by_replica <= {job.request_id for job in reusing}
        for job in reusing:
            assert job.output_ids == _recompute(model, job), (policy, job.request_id)

    replicated = result["policies"]["reactive-heat"]
    assert replicated["replica_blocks_committed"] > 0
    assert replicated["bytes_replicated"] == replicated["replica_blocks_committed"] * block_bytes
    assert result["policies"]["none"]["bytes_replicated"] == 0
