from collections import Counter

import pytest

from speckv.services.common.engine_profile import EngineProfile, LinkModel, get_profile, load_profiles
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.routing.router import Candidate, KvAwareRouter, RouteQuery, best_holder

GEO = KVGeometry(32, 8, 128, "bfloat16", 16)  # 2 MiB per block
PROFILE = EngineProfile("t", "m", "hw", overhead_ms=10.0, ms_per_token=0.1, ms_per_token_pair=0.0, geometry=GEO)


def cand(name, cached=0, queued=0, inflight=0, waiting=0):
    return Candidate(NodeId(name), inflight, cached, GEO.block_size, GEO.bytes_per_block,
                     PROFILE.queue_ms(queued, waiting))


def query(blocks=64, extra=8):
    return RouteQuery("r", list(range(1, blocks + 1)), blocks * 16 + extra, Family("f"))


def router(gbps=25.0, seed=0):
    return KvAwareRouter(PROFILE, LinkModel(gbps, overhead_ms=1.0), seed=seed)


def test_picks_node_with_cached_prefix():
    d = router(gbps=0.001).choose(query(), [cand("a"), cand("b", cached=64), cand("c", cached=10)])
    assert d.node_id == "b" and d.cached_blocks == 64 and d.fetch_from is None
    # 8 uncached tokens: 10 ms + 0.8 ms
    assert d.prefill_ms == pytest.approx(10.8)


def test_avoids_overloaded_cached_node():
    # b holds everything but has 20k tokens queued (2 s); recomputing 1032 tokens costs ~113 ms
    d = router(gbps=0.001).choose(query(), [cand("a"), cand("b", cached=64, queued=20_000)])
    assert d.node_id == "a"
    assert d.queue_ms == 0 and d.prefill_ms == pytest.approx(10 + 0.1 * 1032)


def test_prefers_fetch_when_cheaper_than_recompute():
    # 64 blocks of 2 MiB over 100 Gb/s is ~11 ms; recomputing 1024 tokens is ~102 ms
    d = router(gbps=100).choose(query(), [cand("a"), cand("b", cached=64, queued=20_000)])
    assert d.node_id == "a" and d.fetch_from == "b" and d.fetch_blocks == 64
    assert d.fetch_ms == pytest.approx(1.0 + 64 * GEO.bytes_per_block * 8 / 100e9 * 1e3)
    assert d.expected_ttft_ms == pytest.approx(d.queue_ms + d.fetch_ms + d.prefill_ms)


def test_recomputes_when_link_is_slow():
    d = router(gbps=0.1).choose(query(), [cand("a"), cand("b", cached=64, queued=20_000)])
    assert d.node_id == "a" and d.fetch_from is None and d.fetch_blocks == 0


def test_fetches_only_the_missing_part():
    d = router(gbps=100).estimate(query(), cand("a", cached=40), cand("b", cached=64))
    assert d.fetch_from == "b" and d.fetch_blocks == 24 and d.cached_blocks == 40


def test_ties_spread_by_routes_in_flight_then_seeded_rng():
    r = router(seed=1)
    d = r.choose(query(), [cand("a", inflight=3), cand("b", inflight=1), cand("c", inflight=2)])
    assert d.node_id == "b"
    picks = Counter(r.choose(query(), [cand(n) for n in "abcd"]).node_id for _ in range(400))
    assert set(picks) == set("abcd") and min(picks.values()) > 50
    again = [router(seed=1).choose(query(), [cand(n) for n in "abcd"]).node_id for _ in range(5)]
    assert again == [router(seed=1).choose(query(), [cand(n) for n in "abcd"]).node_id for _ in range(5)]


def test_fully_cached_prompt_still_computes_last_token():
    q = RouteQuery("r", [1, 2], 32, Family("f"))
    d = router().choose(q, [cand("a", cached=2)])
    assert d.prefill_ms == pytest.approx(10.1)


def test_best_holder():
    assert best_holder([cand("a"), cand("b")]) is None
    assert best_holder([cand("a", cached=3, queued=5), cand("b", cached=3), cand("c", cached=1)]).node_id == "b"


def test_packaged_profiles_load_and_cite_sources():
    profiles = load_profiles()
    assert {"llama-3-8b-h100", "llama-3-8b-h200", "tiny"} <= set(profiles)
    for p in profiles.values():
        assert p.source and p.ms_per_token > 0
    llama = get_profile("llama-3-8b-h100")
    assert llama.geometry.bytes_per_token == 128 * 1024
    # an 8k prompt on one H100: a few hundred ms, attention adds a little
    assert 200 < llama.prefill_ms(8192) < 600
    assert llama.prefill_ms(100, cached_tokens=8000) > llama.prefill_ms(100)


def test_unknown_profile_lists_available():
    from speckv.services.common.errors import InvalidArgument
    with pytest.raises(InvalidArgument, match="available: .*tiny"):
        get_profile("gpt-9")
