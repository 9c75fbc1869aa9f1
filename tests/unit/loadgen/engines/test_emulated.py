"""The emulated engine: step times follow the profile, cached and fetched
tokens shorten prefill, batching and chunking behave as documented."""
from __future__ import annotations

import pytest

from speckv.loadgen.engines.emulated import EngineEventKind, EngineJob, job_times
from speckv.loadgen.experiments.e2e_config import load_e2e_config
from speckv.services.common.engine_profile import get_profile
from tests.support.engine_cases import KV_PER_TOKEN, LIMITS, LINK, PROFILE, engine, first_token, run_until_idle


@pytest.mark.parametrize("prompt,cached", [(100, 0), (6000, 0), (12000, 0), (20000, 5000), (3000, 2048)])
def test_a_lone_request_takes_exactly_the_profile_prefill_time(prompt, cached):
    e = engine()
    e.submit(EngineJob("r", prompt, 10, cached_tokens=cached), now=2.0)
    events = run_until_idle(e)
    ttft_ms = (first_token(events, "r") - 2.0) * 1e3
    # Chunked into 8192-token steps or not, the chunk terms telescope.
    assert ttft_ms == pytest.approx(PROFILE.prefill_ms(prompt - cached, cached), rel=1e-9)


def test_prefill_is_chunked_at_the_token_budget():
    e = engine()
    e.submit(EngineJob("r", 20000, 1), now=0.0)
    run_until_idle(e)
    assert e.steps == 3  # 8192 + 8192 + 3616


def test_cached_tokens_shorten_prefill_and_a_full_hit_still_computes_one_token():
    times = {}
    for cached in (0, 4096, 8192, 10000):
        e = engine()
        e.submit(EngineJob("r", 10000, 1, cached_tokens=cached), now=0.0)
        times[cached] = first_token(run_until_idle(e), "r")
    assert times[0] > times[4096] > times[8192] > times[10000]
    assert times[10000] * 1e3 == pytest.approx(PROFILE.prefill_ms(1, 9999))


def test_a_pull_waits_for_the_link_then_skips_the_fetched_tokens():
    e = engine()
    fetch_bytes = 4096 * KV_PER_TOKEN
    e.submit(EngineJob("a", 8192, 1, fetch_tokens=4096, fetch_bytes=fetch_bytes), now=0.0)
    e.submit(EngineJob("b", 8192, 1, fetch_tokens=4096, fetch_bytes=fetch_bytes), now=0.0)
    events = run_until_idle(e)
    transfer_s = LINK.transfer_ms(fetch_bytes) / 1e3
    solo_s = PROFILE.prefill_ms(4096, 4096) / 1e3
    assert first_token(events, "a") == pytest.approx(transfer_s + solo_s)
    # The second pull queued behind the first on the inbound link.
    assert first_token(events, "b") >= 2 * transfer_s + solo_s - 1e-9


def test_decode_steps_follow_the_memory_bound_model_and_tpot_is_reported():
    e = engine()
    e.submit(EngineJob("r", 1000, 11), now=0.0)
    events = run_until_idle(e)
    job = next(ev.job for ev in events if ev.kind is EngineEventKind.FINISHED)
    times = job_times(job, PROFILE.prefill_ms(1000))
    assert times.ttft_ms == pytest.approx(PROFILE.prefill_ms(1000))
    # Decode step k reads the weights and a context of 1000 + k tokens of KV.
    expected = [LIMITS.decode_weights_ms + LIMITS.decode_step_overhead_ms
                + (1000 + k) * KV_PER_TOKEN / (LIMITS.hbm_gb_per_s * 1e9) * 1e3 for k in range(1, 11)]
    assert times.tpot_ms == pytest.approx(sum(expected) / 10)
    assert times.e2e_ms == pytest.approx(times.ttft_ms + sum(expected))
    assert times.queue_ms == pytest.approx(0.0, abs=1e-6)


def test_requests_queue_behind_a_busy_engine_and_decodes_share_prefill_steps():
    e = engine()
    e.submit(EngineJob("a", 8000, 5), now=0.0)
    e.advance(0.0)  # a's prefill step is planned
    e.submit(EngineJob("b", 8000, 1), now=0.01)
    assert e.load().waiting_requests == 2 and e.load().queued_tokens == 16000
    events = run_until_idle(e)
    a, b = first_token(events, "a"), first_token(events, "b")
    assert a == pytest.approx(PROFILE.prefill_ms(8000) / 1e3)
    # b starts when a's step ends and shares it with a's first decode.
    decode_kv_ms = 8001 * KV_PER_TOKEN / (LIMITS.hbm_gb_per_s * 1e9) * 1e3
    assert b == pytest.approx(a + (PROFILE.prefill_ms(8000) + decode_kv_ms) / 1e3)
    assert e.load().waiting_requests == 0 and e.load().running_requests == 0


def test_advance_never_runs_a_step_that_ends_after_now():
    e = engine()
    e.submit(EngineJob("r", 8000, 1), now=0.0)
    assert e.advance(0.1) == []  # the step ends at ~0.36 s
    assert e.load().waiting_requests == 1
    assert [ev.kind for ev in e.advance(1.0)] == [EngineEventKind.FIRST_TOKEN, EngineEventKind.FINISHED]


def test_the_committed_config_uses_the_scheduler_profile():
    config = load_e2e_config()
    assert config.profile == get_profile(config.profile.name)
    assert config.byte_scale == 1024
    assert config.real_bytes_per_block == 64 * 1024 * 1024
    assert config.scaled_link_gbps() == pytest.approx(config.link.gbps / 1024)
