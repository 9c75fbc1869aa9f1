"""The engine's own queue estimate (EngineLoad.queued_prefill_ms), which the
scheduler prefers over the token-linear one: it must predict what a request
arriving now waits for, long prompts included."""
from __future__ import annotations

import pytest

from speckv.loadgen.engines.emulated import EmulatedEngine, EngineEventKind, EngineJob
from speckv.loadgen.engines.fast import FastEngine
from tests.support.engine_cases import KV_PER_TOKEN, LIMITS, LINK, PROFILE, first_token, run_until_idle


@pytest.mark.parametrize("engine_type", [EmulatedEngine, FastEngine])
def test_an_idle_engine_expects_no_wait(engine_type):
    load = engine_type("n", PROFILE, LIMITS, LINK, KV_PER_TOKEN).load()
    assert load.queued_prefill_ms == 0.0 and load.queued_tokens == 0


@pytest.mark.parametrize("engine_type", [EmulatedEngine, FastEngine])
@pytest.mark.parametrize("prompts", [[100_000], [100_000, 900], [20_000, 20_000, 20_000]])
def test_the_estimate_is_each_waiting_prompt_alone(engine_type, prompts):
    e = engine_type("n", PROFILE, LIMITS, LINK, KV_PER_TOKEN)
    for i, p in enumerate(prompts):
        e.submit(EngineJob(f"r{i}", p, 0, cached_tokens=512), now=0.0)
    expected = sum(PROFILE.prefill_ms(p - 512, 512) for p in prompts)
    assert e.load().queued_prefill_ms == pytest.approx(expected, rel=1e-12)


def test_the_estimate_predicts_the_wait_behind_a_long_prompt_and_beats_the_token_linear_one():
    e = EmulatedEngine("n", PROFILE, LIMITS, LINK, KV_PER_TOKEN)
    e.submit(EngineJob("long", 100_000, 1), now=0.0)
    load = e.load()
    e.submit(EngineJob("short", 900, 1), now=0.0)
    events = run_until_idle(e)
    waited_ms = first_token(events, "short") * 1e3 - PROFILE.prefill_ms(900, 0)
    assert waited_ms == pytest.approx(load.queued_prefill_ms, rel=0.02)  # the long one's decode step differs
    linear_ms = PROFILE.queue_ms(load.queued_tokens, load.waiting_requests)
    assert abs(linear_ms - waited_ms) > 5 * abs(load.queued_prefill_ms - waited_ms)


def test_running_sequences_add_their_kv_reads_to_every_prefill_step():
    e = EmulatedEngine("n", PROFILE, LIMITS, LINK, KV_PER_TOKEN)
    e.submit(EngineJob("decoding", 10_000, 1000), now=0.0)
    events = []
    while not any(ev.kind is EngineEventKind.FIRST_TOKEN for ev in events):
        events += e.advance(e.next_event_s())
    e.submit(EngineJob("queued", 3 * 8191, 1), now=events[-1].time_s)
    load = e.load()
    steps = 3  # 24573 tokens over a budget of 8192 - 1 decode
    kv_read_ms = load.running_tokens * KV_PER_TOKEN / (LIMITS.hbm_gb_per_s * 1e9) * 1e3
    assert load.queued_prefill_ms == pytest.approx(PROFILE.prefill_ms(3 * 8191, 0) + steps * kv_read_ms)
