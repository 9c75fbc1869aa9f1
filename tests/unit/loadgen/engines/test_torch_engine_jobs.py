"""Trace requests into torch jobs: model-token scaling, the job factory's
token mapping (deterministic; shared id prefixes give shared token prefixes
and shared, bit-exact KV), and the router's default emulated factory."""
from __future__ import annotations

import itertools

import pytest

from speckv.loadgen.engines.emulated import EngineJob
from speckv.loadgen.engines.torch_engine import TorchJob, TorchJobs
from speckv.loadgen.engines.torch_kv import model_scale
from speckv.loadgen.experiments.reference_router import EmulatedJobs, Placement
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.traces import TraceRequest
from tests.support.torch_engine_helpers import BLOCK, SPEC, core_store, engine, run

TRACE_BLOCK = 512
NOWHERE = Placement("n", 0, 0, "")


def trace_request(ids: tuple[int, ...], prompt: int, output: int = 350, family: str = "f") -> TraceRequest:
    return TraceRequest(1.0, prompt, output, ids, TRACE_BLOCK, family)


def scaled(ids: tuple[int, ...], prompt: int, output: int = 350) -> TraceRequest:
    return model_scale(trace_request(ids, prompt, output), BLOCK, SPEC.max_positions)


def test_model_scale_keeps_blocks_ids_and_family_and_scales_tokens():
    r = scaled((5, 6, 7, 8), 3 * TRACE_BLOCK + 100, 350)
    # 3 full blocks of BLOCK tokens, a tail of ceil(100 * 16 / 512) = 4, output ceil(350 / 32) = 11.
    assert (r.prompt_tokens, r.output_tokens, r.block_tokens, r.full_blocks) == (3 * BLOCK + 4, 11, BLOCK, 3)
    assert r.block_hashes == (5, 6, 7, 8) and r.family == "f" and r.arrival_s == 1.0
    # A tail one token short of a block stays partial: full-block counts never change.
    assert scaled((1, 2), 2 * TRACE_BLOCK - 1).full_blocks == 1
    assert scaled((1, 2), 2 * TRACE_BLOCK - 1).prompt_tokens == BLOCK + BLOCK - 1
    assert (scaled((), 0, 0).prompt_tokens, scaled((), 0, 0).output_tokens) == (1, 1)


def test_model_scale_caps_long_prompts_at_the_models_positions():
    blocks = SPEC.max_positions // BLOCK + 10  # more than the model can hold
    r = scaled(tuple(range(blocks)), blocks * TRACE_BLOCK, 2000)
    assert r.prompt_tokens + r.output_tokens <= SPEC.max_positions
    assert r.prompt_tokens == r.full_blocks * BLOCK and r.block_hashes == tuple(range(r.full_blocks))
    assert r.full_blocks == (SPEC.max_positions - r.output_tokens - 1) // BLOCK
    with pytest.raises(InvalidArgument):
        model_scale(trace_request((1,), TRACE_BLOCK), 0, SPEC.max_positions)


def test_jobs_are_deterministic_and_share_token_prefixes_with_their_ids():
    jobs = TorchJobs(SPEC, BLOCK)
    first = scaled((0, 11, 12, 13), 4 * TRACE_BLOCK + 300)
    turn = scaled((0, 11, 12, 13, 14, 15), 6 * TRACE_BLOCK + 7)  # the next turn of the same conversation
    other = scaled((0, 21, 22), 3 * TRACE_BLOCK)  # another conversation, same system prompt (id 0)
    a, again = jobs.make_job("r1", first, 3, NOWHERE), jobs.make_job("r1", first, 3, NOWHERE)
    b, c = jobs.make_job("r2", turn, 3, NOWHERE), jobs.make_job("r3", other, 3, NOWHERE)
    assert isinstance(a, TorchJob) and a.tokens == again.tokens and a.prompt_tokens == len(a.tokens)
    assert a.block_hashes == (0, 11, 12, 13) and b.block_hashes == (0, 11, 12, 13, 14, 15)
    assert b.tokens[:4 * BLOCK] == a.tokens[:4 * BLOCK]  # shared ids -> shared tokens
    assert c.tokens[:BLOCK] == a.tokens[:BLOCK] and c.tokens[BLOCK:2 * BLOCK] != a.tokens[BLOCK:2 * BLOCK]
    # Tails are seeded by the request id: the same request under another id differs only there.
    renamed = jobs.make_job("r9", first, 3, NOWHERE)
    assert renamed.tokens[:4 * BLOCK] == a.tokens[:4 * BLOCK] and renamed.tokens[4 * BLOCK:] != a.tokens[4 * BLOCK:]
    assert all(0 <= t < SPEC.vocab_size for t in b.tokens) and a.family == "f"


def test_jobs_pull_only_when_the_route_fetches_and_need_model_tokens():
    jobs = TorchJobs(SPEC, BLOCK)
    r = scaled((0, 1, 2), 3 * TRACE_BLOCK)
    assert jobs.make_job("p", r, 1, Placement("n", 0, 2 * BLOCK, "peer")).fetch_from == "peer"
    assert jobs.make_job("q", r, 1, Placement("n", BLOCK, 0, "peer")).fetch_from == ""
    with pytest.raises(InvalidArgument, match="model_scale"):
        jobs.make_job("raw", trace_request((0, 1, 2), 3 * TRACE_BLOCK), 1, NOWHERE)


def test_shared_trace_ids_give_bit_exact_reuse_on_the_engine():
    jobs = TorchJobs(SPEC, BLOCK)
    _, store = core_store()
    eng = engine(store)
    first = jobs.make_job("r1", scaled((0, 11, 12, 13), 4 * TRACE_BLOCK + 300), 6, NOWHERE)
    turn_request = scaled((0, 11, 12, 13, 14), 5 * TRACE_BLOCK + 40)
    turn = jobs.make_job("r2", turn_request, 6, NOWHERE)
    run(eng, first)
    run(eng, turn)
    # The kvstore is keyed by the trace's ids, so the next turn finds all four shared blocks.
    assert store.prefix_blocks([0, 11, 12, 13, 14]) == 5 and turn.reused_blocks == 4
    _, fresh = core_store("fresh")
    recomputed = jobs.make_job("r2", turn_request, 6, NOWHERE)
    run(engine(fresh, "fresh"), recomputed)
    assert recomputed.computed_tokens == len(recomputed.tokens) and recomputed.output_ids == turn.output_ids
    # The time from the job's first prefill step to its first token is what is not queueing.
    assert jobs.solo_prefill_ms(turn) == pytest.approx((turn.first_token_s - turn.prefill_start_s) * 1e3)
    assert jobs.solo_prefill_ms(EngineJob("e", 4, 1)) == 0.0


def test_a_step_never_takes_a_job_submitted_after_it_started():
    ticks = itertools.count()
    _, store = core_store()
    eng = engine(store, timer=lambda: float(next(ticks)))  # every step lasts 1 s
    jobs = TorchJobs(SPEC, BLOCK)
    early = jobs.make_job("early", scaled((1, 2), 2 * TRACE_BLOCK), 3, NOWHERE)
    late = jobs.make_job("late", scaled((3,), TRACE_BLOCK + 5), 1, NOWHERE)
    eng.submit(early, 0.0)
    eng.advance(0.0)  # step 1 runs over [0, 1): early's prefill
    # The caller is late (a live driver polls): step 2, early's decode, starts at 1,
    # before late arrived at 1.5, so late must wait for step 3.
    eng.submit(late, 1.5)
    eng.advance(float("inf"))
    assert early.prefill_start_s == 0.0 and late.prefill_start_s == 2.0 and late.first_token_s == 3.0


def test_emulated_jobs_carry_the_route_and_price_the_profile():
    profile = get_profile("llama-3-8b-h100")
    factory = EmulatedJobs(profile, real_bytes_per_token=131072)
    request = TraceRequest(1.0, 4 * TRACE_BLOCK + 10, 50, (0, 1, 2, 3), TRACE_BLOCK, "f")
    job = factory.make_job("e1", request, 50, Placement("n", TRACE_BLOCK, 2 * TRACE_BLOCK, "m"))
    assert (job.prompt_tokens, job.output_tokens, job.cached_tokens, job.fetch_tokens) == \
        (4 * TRACE_BLOCK + 10, 50, TRACE_BLOCK, 2 * TRACE_BLOCK)
    assert job.fetch_bytes == 2 * TRACE_BLOCK * 131072 and not factory.owns_kv
    assert factory.solo_prefill_ms(job) == profile.prefill_ms(TRACE_BLOCK + 10, 3 * TRACE_BLOCK)
