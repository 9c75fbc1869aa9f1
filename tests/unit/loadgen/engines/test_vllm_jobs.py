"""Trace requests as token-id prompts for the real vLLM engines
(loadgen/engines/vllm_jobs.py). The ids here come from a stand-in chain (a
sha256 of the block's tokens under its parent), so the scaling and renaming
are checked without vLLM; that chain_block_ids names blocks exactly as the
connector saves them is checked on a real engine (tests/e2e, the connector's
routing test)."""
from __future__ import annotations

import hashlib
from typing import Sequence

import pytest

from speckv.loadgen.engines.vllm_jobs import VllmJobs, VllmPrompts
from speckv.loadgen.engines.vllm_server import VllmJob
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.traces import TraceRequest

GEOMETRY = KVGeometry(num_layers=4, num_kv_heads=4, head_dim=64, dtype="float32", block_size=32)
VOCAB = 2048


def chain(model_id: str):
    def ids(tokens: Sequence[int]) -> list[int]:
        parent, out = model_id.encode(), []
        for start in range(0, len(tokens), GEOMETRY.block_size):
            parent = hashlib.sha256(parent + repr(list(tokens[start:start + GEOMETRY.block_size])).encode()).digest()
            out.append(int.from_bytes(parent[:8], "big") or 1)
        return out
    return ids


def prompts(model_id: str = "m", max_len: int = 4096) -> VllmPrompts:
    return VllmPrompts(model_id, GEOMETRY, VOCAB, max_len, ids=chain(model_id))


def request(blocks: Sequence[int], prompt_tokens: int, arrival_s: float = 1.0, family: str = "c1",
            output_tokens: int = 320) -> TraceRequest:
    return TraceRequest(arrival_s, prompt_tokens, output_tokens, tuple(blocks), 512, family)


def test_a_shared_trace_prefix_stays_a_shared_token_prefix_under_the_same_ids():
    p = prompts()
    first, second = p.scale([request([7, 8, 9], 3 * 512 + 100), request([7, 8, 10, 11], 4 * 512 + 5, 2.0)])
    assert first.block_hashes[:2] == second.block_hashes[:2]
    assert first.block_hashes[2] != second.block_hashes[2]
    a, b = p.tokens(first), p.tokens(second)
    assert a[:64] == b[:64] and a[64:96] != b[64:96]


def test_scaling_is_one_engine_block_per_trace_block_and_the_tail_stays_partial():
    scaled = prompts().scale([request([1, 2, 3], 3 * 512 + 100, output_tokens=320)])[0]
    assert (scaled.block_tokens, scaled.full_blocks, len(scaled.block_hashes)) == (32, 3, 3)
    assert scaled.prompt_tokens == 3 * 32 + 7 and scaled.output_tokens == 20  # ceil(100/16), ceil(320/16)


def test_the_ids_are_the_model_ids_chain_of_the_tokens():
    p = prompts("model-a")
    scaled = p.scale([request([1, 2], 2 * 512 + 1)])[0]
    tokens = p.tokens(scaled)
    assert list(scaled.block_hashes) == chain("model-a")(tokens[:64])
    other = prompts("model-b").scale([request([1, 2], 2 * 512 + 1)])[0]
    assert set(other.block_hashes).isdisjoint(scaled.block_hashes)  # another model's blocks are other blocks


def test_the_same_request_always_gets_the_same_prompt():
    one, two = prompts(), prompts()
    r = request([5, 6], 2 * 512 + 300, arrival_s=3.5)
    a, b = one.scale([r])[0], two.scale([r])[0]
    assert a == b and one.tokens(a) == two.tokens(b)
    assert all(0 <= t < VOCAB for t in one.tokens(a))


def test_a_prompt_longer_than_the_engine_takes_loses_trailing_blocks():
    scaled = prompts(max_len=3 * 32 + 40).scale([request(range(1, 11), 10 * 512, output_tokens=160)])[0]
    assert scaled.full_blocks == 3 and len(scaled.block_hashes) == 3
    assert scaled.prompt_tokens + scaled.output_tokens <= 3 * 32 + 40


def test_a_request_these_prompts_did_not_scale_is_refused():
    p = prompts()
    with pytest.raises(InvalidArgument, match="not scaled"):
        p.tokens(request([1], 600))


def test_jobs_carry_the_prompt_and_price_their_own_prefill_with_the_fitted_profile():
    p = prompts()
    scaled = p.scale([request([1, 2, 3, 4], 4 * 512 + 64)])[0]
    profile = get_profile("tiny-llama-vllm-cpu")
    jobs = VllmJobs(p, profile)
    job = jobs.make_job("r1", scaled, 5, None)  # type: ignore[arg-type]
    assert isinstance(job, VllmJob) and job.tokens == p.tokens(scaled) and job.prompt_tokens == len(job.tokens)
    assert jobs.owns_kv
    job.cached_tokens = 64
    assert jobs.solo_prefill_ms(job) == pytest.approx(profile.prefill_ms(job.prompt_tokens - 64, 64))


def test_a_job_whose_route_chose_a_pull_names_the_peer_for_its_connector():
    from speckv.loadgen.engines.vllm_server import pull_params
    from speckv.loadgen.experiments.reference_router import Placement

    p = prompts()
    scaled = p.scale([request([1, 2, 3, 4], 4 * 512 + 64)])[0]
    jobs = VllmJobs(p, get_profile("tiny-llama-vllm-cpu"))
    assert jobs.make_job("r1", scaled, 5, Placement("n1", 32, 64, "n2")).pull_from == "n2"
    assert jobs.make_job("r2", scaled, 5, Placement("n1", 32, 0, "")).pull_from == ""
    assert pull_params("n2") == {"speckv": {"pull_from": "n2"}} and pull_params("") is None


def test_a_pulls_tokens_are_attributed_from_vllms_one_figure():
    from speckv.loadgen.engines.vllm_server import attributed_pull

    job = VllmJob("r", 300, 4, tokens=(1,) * 300, pull_from="n2", route_cached_tokens=64, route_fetch_tokens=128)
    assert attributed_pull(job, 192) == 128  # all Route said, beyond the node's own 64
    assert attributed_pull(job, 100) == 36  # the pull brought less (evicted meanwhile, or a failure)
    assert attributed_pull(job, 32) == 0  # the engine found less than Route thought, and nothing came
    assert attributed_pull(VllmJob("s", 300, 4, tokens=(1,) * 300), 192) == 0  # no pull asked
