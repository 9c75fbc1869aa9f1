"""The torch engine on in-process KVStoreCores: real model, real KV bytes."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from speckv.loadgen.engines.emulated import EngineEventKind, EngineJob, Phase, job_times
from speckv.loadgen.engines.torch_engine import TorchLimits
from speckv.loadgen.engines.torch_kv import HASH_MASK, StoredBlock, chain_hashes, trace_tokens
from speckv.loadgen.engines.torch_model import KVCache, ModelSpec
from speckv.services.common.errors import InvalidArgument
from tests.support.torch_engine_helpers import BLOCK, GEOMETRY, SPEC, core_store, engine, job, model, prompt, run


def test_chain_hashes_name_prefixes():
    a = prompt(1, 5 * BLOCK + 3)
    b = a[:3 * BLOCK] + prompt(2, 2 * BLOCK)
    ha, hb = chain_hashes(a, BLOCK), chain_hashes(b, BLOCK)
    assert len(ha) == 5 and len(hb) == 5
    assert ha[:3] == hb[:3] and all(x != y for x, y in zip(ha[3:], hb[3:]))
    assert ha == chain_hashes(a, BLOCK) and all(0 <= h <= HASH_MASK for h in ha)
    # A changed first block changes every later id (the chain), and so does the salt.
    c = prompt(3, BLOCK) + a[BLOCK:]
    assert all(x != y for x, y in zip(ha, chain_hashes(c, BLOCK)))
    assert set(chain_hashes(a, BLOCK, salt=b"other model")).isdisjoint(ha)


def test_trace_tokens_share_prefixes_and_scale_lengths():
    one = trace_tokens([11, 12, 13], 3 * 512 + 100, 512, BLOCK, SPEC.vocab_size, tail_seed=1)
    two = trace_tokens([11, 12, 99], 3 * 512, 512, BLOCK, SPEC.vocab_size, tail_seed=2)
    assert len(one) == 3 * BLOCK + 4 and len(two) == 3 * BLOCK
    assert one[:2 * BLOCK] == two[:2 * BLOCK] and one[2 * BLOCK:3 * BLOCK] != two[2 * BLOCK:]
    assert len(trace_tokens([], 10, 512, BLOCK, SPEC.vocab_size)) == 1


def test_block_export_import_is_bit_exact_through_the_store():
    tokens = prompt(4, 3 * BLOCK + 5)
    cache = KVCache(SPEC, 64)
    for start in range(0, len(tokens), BLOCK):
        model().forward_chunk(list(tokens[start:start + BLOCK]), cache)
    core, store = core_store()
    hashes = chain_hashes(tokens, BLOCK)
    store.put([StoredBlock(h, hashes[i - 1] if i else None, cache.export_block(i, BLOCK))
               for i, h in enumerate(hashes)], "fam")
    back = KVCache(SPEC, 64)
    back.import_blocks([np.frombuffer(d, np.float32).reshape(GEOMETRY.block_shape) for d in store.get(hashes)], BLOCK)
    n = 3 * BLOCK
    # Bit patterns, not float equality (a NaN or -0.0 would slip through ==).
    assert torch.equal(back.k[:, :n].view(torch.int32), cache.k[:, :n].view(torch.int32))
    assert torch.equal(back.v[:, :n].view(torch.int32), cache.v[:, :n].view(torch.int32))
    assert back.length == n


def test_cached_prefix_skips_its_prefill_and_gives_the_same_tokens():
    _, store = core_store()
    eng = engine(store)
    base = prompt(5, 6 * BLOCK + 7)
    first = job("r1", base)
    run(eng, first)
    assert (first.computed_tokens, first.reused_blocks, first.stored_blocks) == (len(base), 0, 6)
    # Same prompt again: the six stored blocks are read back, only the tail is computed.
    again = job("r2", base)
    run(eng, again)
    assert (again.reused_blocks, again.computed_tokens, again.cached_tokens) == (6, 7, 6 * BLOCK)
    assert again.output_ids == first.output_ids and len(first.output_ids) == 8
    # A prompt sharing 4 blocks then diverging computes everything after them.
    fork = job("r3", prompt(6, 9 * BLOCK, prefix=base[:4 * BLOCK + 3]))
    run(eng, fork)
    assert (fork.reused_blocks, fork.computed_tokens) == (4, 5 * BLOCK)
    _, fresh_store = core_store()
    recomputed = job("r3-full", fork.tokens)
    run(engine(fresh_store), recomputed)
    assert recomputed.computed_tokens == len(fork.tokens) and recomputed.output_ids == fork.output_ids
    assert eng.computed_tokens == len(base) + 7 + 5 * BLOCK


def test_fully_cached_prompt_recomputes_its_last_block():
    _, store = core_store()
    eng = engine(store)
    tokens = prompt(7, 4 * BLOCK)
    first, second = job("a", tokens), job("b", tokens)
    run(eng, first)
    run(eng, second)
    assert (second.reused_blocks, second.computed_tokens, second.stored_blocks) == (3, BLOCK, 1)
    assert second.output_ids == first.output_ids


def test_pull_from_a_peer_store_and_fallback_when_the_peer_lacks_it():
    _, store_a = core_store("a")
    _, store_b = core_store("b")
    tokens = prompt(8, 5 * BLOCK + 1)
    origin = job("o", tokens)
    run(engine(store_a, "a"), origin)
    eng_b = engine(store_b, "b", peers={"a": store_a})
    pulled = job("p", tokens, fetch_from="a")
    run(eng_b, pulled)
    assert (pulled.reused_blocks, pulled.fetched_blocks, pulled.computed_tokens) == (0, 5, 1)
    assert pulled.fetch_tokens == 5 * BLOCK and pulled.output_ids == origin.output_ids
    # B now holds the pulled blocks itself.
    local = job("l", tokens)
    run(eng_b, local)
    assert (local.reused_blocks, local.fetched_blocks) == (5, 0) and local.output_ids == origin.output_ids
    other = job("x", prompt(9, 3 * BLOCK), fetch_from="a")
    run(eng_b, other)
    assert (other.fetched_blocks, other.computed_tokens) == (0, 3 * BLOCK)


def test_continuous_batching_respects_budgets_and_reports_load():
    _, store = core_store()
    eng = engine(store, limits=TorchLimits(prefill_blocks_per_step=2, max_num_seqs=2))
    long, short, late = job("long", prompt(10, 7 * BLOCK), 3), job("short", prompt(11, BLOCK), 2), \
        job("late", prompt(12, BLOCK + 1), 1)
    for j in (long, short, late):
        eng.submit(j, 0.0)
    assert eng.load().queued_tokens == 9 * BLOCK + 1 and eng.load().waiting_requests == 3
    order = []
    while eng.next_event_s() is not None:
        order.extend((e.kind, e.job.request_id) for e in eng.advance(float("inf")))
    # Two prefill blocks a step, FCFS: long's 7 blocks take steps 1-4 and step 4's spare block
    # is short's. Both then decode, holding the two seats, so late waits until short finishes
    # (step 5) and prefills in step 6 beside long's last decode.
    assert order == [(EngineEventKind.FIRST_TOKEN, "long"), (EngineEventKind.FIRST_TOKEN, "short"),
                     (EngineEventKind.FINISHED, "short"), (EngineEventKind.FINISHED, "long"),
                     (EngineEventKind.FIRST_TOKEN, "late"), (EngineEventKind.FINISHED, "late")]
    for j in (long, short, late):
        assert j.phase is Phase.DONE and len(j.output_ids) == j.output_tokens == j.tokens_out
    assert eng.steps == 6 and eng.load() == type(eng.load())(0, 0, 0, 0)


def test_events_are_released_when_the_measured_step_has_ended():
    ticks = itertools.count()
    _, store = core_store()
    # A fake timer: each step "takes" exactly 1 timer second, scaled to 2 engine seconds.
    eng = engine(store, timer=lambda: float(next(ticks)) / 2, time_scale=4.0)
    j = job("t", prompt(13, 2 * BLOCK), 2)
    eng.submit(j, 10.0)
    assert eng.advance(9.0) == [] and j.computed_tokens == 0  # nothing starts before submit
    assert eng.advance(10.0) == [] and j.computed_tokens == 2 * BLOCK  # ran, but ends at 12
    assert eng.next_event_s() == pytest.approx(12.0)
    events = eng.advance(12.0)
    assert [e.kind for e in events] == [EngineEventKind.FIRST_TOKEN] and events[0].time_s == pytest.approx(12.0)
    assert [e.kind for e in eng.advance(100.0)] == [EngineEventKind.FINISHED]
    times = job_times(j, solo_prefill_ms=2000.0)
    assert times.ttft_ms == pytest.approx(2000.0) and times.e2e_ms == pytest.approx(4000.0)


@pytest.mark.parametrize("bad", [
    lambda: EngineJob("e", 4, 1),
    lambda: job("mismatch", prompt(1, 8)).__class__("m", 9, 1, tokens=prompt(1, 8)),
    lambda: job("peer", prompt(1, 8), fetch_from="nowhere"),
    lambda: job("long", prompt(1, SPEC.max_positions)),
])
def test_bad_jobs_are_invalid_argument(bad):
    _, store = core_store()
    with pytest.raises(InvalidArgument):
        engine(store).submit(bad(), 0.0)


def test_model_spec_validates_its_shape():
    with pytest.raises(InvalidArgument, match="num_kv_heads"):
        ModelSpec(num_heads=4, num_kv_heads=3)
    with pytest.raises(InvalidArgument, match="num_heads"):
        ModelSpec(d_model=100, num_heads=3)
    assert SPEC.kv_geometry(BLOCK).bytes_per_block == 2 * 2 * BLOCK * 2 * 32 * 4
