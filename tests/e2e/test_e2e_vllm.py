"""`speckv bench e2e --engine vllm`: a short live comparison on real
services with real vLLM OpenAI servers (SpeckvConnector on each node's
kvstore), through the CLI's code path (e2e.compare with the vllm setup).

The slice [450, 458) s of the conversation trace holds a conversation turn
that returns within seconds (at 453 and 456 s). The cluster is the
committed real-engine one (services/config/e2e_vllm.json) with 150 s of
warm-up and 200 warm blocks, and `reactive-heat` gets a policies file that
replicates any family seen once, so the engines' KV does cross between
kvstores; what a `--config` file could set, nothing else. Asserted: every
request served with its tokens streamed; the kvstores hold the model's KV
geometry at scale 1; what the engines save is their own KV, never counted
as a replica (`none` replicates nothing); an order moves real bytes of the
engines' KV; the figures the report needs are there. Nothing about times.
That loaded KV gives the recompute's tokens is the connector tests' (one
prompt at a time, where greedy output is deterministic).
"""
from __future__ import annotations

import dataclasses

import pytest
from rich.console import Console

from speckv.loadgen.bench.e2e import cli as e2e
from speckv.loadgen.bench.e2e.engines import engine_setup
from speckv.loadgen.bench.e2e.vllm_engines import BLOCK_TOKENS, model_geometry
from speckv.loadgen.engines.vllm_server import VllmJob
from speckv.loadgen.experiments.e2e_config import SliceSpec, load_e2e_config
from tests.support.eager_heat import eager_heat_policies

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
POLICIES = ["none", "reactive-heat"]
SLICE = SliceSpec(450.0, 8.0, 1.0)


def _config(tmp_path):
    path = eager_heat_policies(tmp_path)
    config = load_e2e_config(e2e.VLLM_CONFIG)
    return dataclasses.replace(config, warmup_s=150.0,
                               extra_args={**config.extra_args, "scheduler": ["--policies-path", str(path)]})


def test_vllm_engine_comparison_serves_every_request_and_keeps_saves_apart_from_replicas(tmp_path, traces_dir):
    config = _config(tmp_path)
    setup = dataclasses.replace(engine_setup(config, "vllm", cache_root=tmp_path / "models"), warm_kv_blocks=200)
    comparison, runs = e2e.compare(traces_dir / "mooncake_conversation_trace.jsonl", POLICIES, config, SLICE, {},
                                   Console(quiet=True), quick=True, setup=setup)
    result = comparison.to_json()
    geometry, _ = model_geometry(setup.vllm.directory)
    assert (result["engine"], result["byte_scale_factor"]) == ("vllm", 1)
    assert result["real_bytes_per_block"] == geometry.bytes_per_block == 4 * 2 * BLOCK_TOKENS * 4 * 64 * 4
    assert any("vLLM OpenAI server" in note for note in result["notes"])

    for policy in POLICIES:
        run, summary = runs[policy], result["policies"][policy]
        assert summary["served"] == summary["requests"] == len(run.records) > 0, policy
        assert summary["errors"] == 0, policy
        for record in run.records:
            job = run.jobs[record.request_id]
            assert isinstance(job, VllmJob) and len(job.output_ids) == record.output_tokens == job.output_tokens
            assert record.ttft_ms > 0 and 0 <= record.cached_tokens < record.prompt_tokens
        for node, stats in run.kvstores.items():
            assert (stats.geometry.num_layers, stats.geometry.block_size) == (4, BLOCK_TOKENS), node
            assert stats.used_pages > 0, node  # the warm start's and the replay's saves
        assert run.warm is not None and run.warm.stored_blocks > 0
    assert result["policies"]["none"]["bytes_replicated"] == 0  # saves are STORED, not replicas landing
    heat = result["policies"]["reactive-heat"]
    assert heat["replica_blocks_committed"] > 0
    assert heat["bytes_replicated"] == heat["replica_blocks_committed"] * geometry.bytes_per_block
    assert all(result["policies"][p]["ci95"] for p in POLICIES)
