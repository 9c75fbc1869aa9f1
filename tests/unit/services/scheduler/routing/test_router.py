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


# --- tiers: a host hit, a peer pull and recompute, priced by hand ----------------------------
# Blocks are 2 MiB. Host link: 8 Gbit/s (1 GB/s) and 0.5 ms a copy, so promoting
# k blocks costs 0.5 + k * 2.097152 ms. Network: 25 Gbit/s, 1 ms a transfer:
# k blocks cost 1 + k * 0.67108864 ms. Prefill: 10 ms + 0.1 ms a new token.
MIB2_MS_HOST = GEO.bytes_per_block * 8 / 8e9 * 1e3
MIB2_MS_NET = GEO.bytes_per_block * 8 / 25e9 * 1e3


def tiered(host_gbps=8.0, seed=0):
    return KvAwareRouter(PROFILE, LinkModel(25.0, overhead_ms=1.0), seed=seed,
                         host_link=LinkModel(host_gbps, overhead_ms=0.5))


def host_cand(name, cached=0, host_blocks=0, queued=0):
    c = cand(name, cached=cached, queued=queued)
    c.host_blocks = host_blocks
    return c


def test_a_host_hit_costs_its_promotion_and_beats_recompute():
    # a holds all 64 blocks, 40 of them in its host tier only: 0.5 + 40 x 2.097 = 84.4 ms of
    # promotion + 10.8 ms prefill = 95.2 ms. b (5 ms of queue) would recompute for 113.2 ms, or
    # pull from a's host tier at a's host-link speed (84.4 ms, the network's 43.9 ms hidden
    # under it) for the same 95.2 ms plus its queue.
    d = tiered().choose(query(), [host_cand("a", cached=64, host_blocks=40), cand("b", queued=50)])
    promote = 0.5 + 40 * MIB2_MS_HOST
    assert d.node_id == "a" and d.promote_blocks == 40 and d.promote_ms == pytest.approx(promote)
    assert d.expected_ttft_ms == pytest.approx(promote + 10.8)


def test_recompute_wins_when_the_host_link_is_too_slow_to_promote():
    # At 1 Gbit/s, promoting 40 blocks takes 671 ms: recomputing 1032 tokens (113.2 ms) is cheaper.
    # b's pull from a's host tier is as slow: b recomputes.
    d = tiered(host_gbps=1.0).choose(query(), [host_cand("a", cached=64, host_blocks=40), cand("b")])
    assert d.node_id == "b" and d.promote_blocks == 0 and d.fetch_from is None
    assert d.expected_ttft_ms == pytest.approx(10 + 0.1 * 1032)


def test_a_peer_pull_beats_a_host_hit_that_needs_more_promotion():
    # a: 64 blocks, all host-only (0.5 + 64 x 2.097 = 134.7 ms, then 10.8 ms);
    # b: nothing, pulls 64 blocks from c's device tier (1 + 64 x 0.671 = 43.9 ms, then 10.8 ms);
    # c: holds all 64 on its device tier but has 20k tokens queued (2 s).
    cands = [host_cand("a", cached=64, host_blocks=64), cand("b"), cand("c", cached=64, queued=20_000)]
    d = tiered().choose(query(), cands)
    pull = 1 + 64 * MIB2_MS_NET
    assert d.node_id == "b" and d.fetch_from == "c" and d.fetch_blocks == 64
    assert d.expected_ttft_ms == pytest.approx(pull + 10.8)


def test_a_pull_waits_for_the_longer_of_its_own_promotion_and_the_transfer():
    # a holds 32 blocks, 16 host-only (0.5 + 16 x 2.097 = 34.1 ms); it pulls 32 more from
    # b (1 + 32 x 0.671 = 22.5 ms): both run at once, so 34.1 ms, then prefill 10.8 ms.
    d = tiered().estimate(query(), host_cand("a", cached=32, host_blocks=16), cand("b", cached=64))
    promote = 0.5 + 16 * MIB2_MS_HOST
    assert d.fetch_from == "b" and d.fetch_blocks == 32 and d.promote_blocks == 16
    assert d.expected_ttft_ms == pytest.approx(max(promote, 1 + 32 * MIB2_MS_NET) + 10.8)


def test_a_pull_from_a_peer_s_host_tier_goes_at_the_slower_of_its_host_link_and_the_network():
    # b holds 64 blocks in its host tier alone; at 16 Gbit/s its host link (0.5 + 64 x 1.049 =
    # 67.6 ms) is slower than the 25 Gbit/s network (43.9 ms), so the pull takes 67.6 ms (and
    # 67.6 + 10.8 ms beats recomputing for 113.2 ms).
    d = tiered(host_gbps=16.0).estimate(query(), cand("a"), host_cand("b", cached=64, host_blocks=64))
    assert d.fetch_from == "b" and d.fetch_ms == pytest.approx(0.5 + 64 * MIB2_MS_HOST / 2)


def test_without_a_host_link_host_blocks_cost_nothing_extra():
    d = router().choose(query(), [host_cand("a", cached=64, host_blocks=64)])
    assert d.promote_ms == 0.0 and d.expected_ttft_ms == pytest.approx(10.8)


def test_a_pull_exactly_as_dear_as_prefilling_is_not_taken_and_one_ms_cheaper_is():
    """'Pull only when strictly cheaper' at its boundary. Exact arithmetic:
    1 ms per new token, no overheads or pairs, and blocks of 0 bytes, so a
    pull costs exactly the link's overhead_ms. Prompt 101 tokens: prefilling
    all of them locally is 101 ms; after pulling 5 blocks (50 tokens) of the
    holder's prefix it is 51 ms, plus the pull."""
    exact = EngineProfile("x", "m", "hw", overhead_ms=0.0, ms_per_token=1.0, ms_per_token_pair=0.0, geometry=GEO)
    q = RouteQuery("r", list(range(1, 11)), 101, Family("f"))
    node = Candidate(NodeId("n"), 0, 0, 10, 0, 0.0)
    holder = Candidate(NodeId("h"), 0, 5, 10, 0, 0.0)
    tie = KvAwareRouter(exact, LinkModel(25.0, overhead_ms=50.0)).estimate(q, node, holder)
    assert (tie.fetch_from, tie.fetch_blocks, tie.expected_ttft_ms) == (None, 0, 101.0)  # 50 + 51 == 101: local
    cheaper = KvAwareRouter(exact, LinkModel(25.0, overhead_ms=49.0)).estimate(q, node, holder)
    assert (cheaper.fetch_from, cheaper.fetch_blocks, cheaper.expected_ttft_ms) == ("h", 5, 100.0)


# A disk load: 64 blocks only on b's disk. Its local prefill is 10 + 0.8 ms (8 new tokens), recomputing
# the 1032 tokens 10 + 103.2 ms: loading wins while the host copy plus the disk read stay under 102.4 ms.
HOST = LinkModel(1e6, overhead_ms=0.0)  # ~1 us for 128 MiB: the disk's overhead decides


def disk_router(disk_overhead_ms):
    return KvAwareRouter(PROFILE, LinkModel(0.001, overhead_ms=1.0), host_link=HOST,
                         disk=LinkModel(1e6, overhead_ms=disk_overhead_ms))


def on_disk(name, blocks=64):
    c = cand(name, cached=blocks)
    c.host_blocks = c.disk_blocks = blocks
    return c


def test_a_disk_load_strictly_cheaper_than_recompute_is_taken():
    gap = 103.2 - 0.8
    d = disk_router(gap - 0.01).choose(query(), [on_disk("b")])
    assert d.cached_blocks == 64 and d.promote_blocks == 64 and d.disk_blocks == 64
    assert d.promote_ms == pytest.approx(gap - 0.01, abs=5e-3)  # + ~2 us of copies
    assert d.expected_ttft_ms == pytest.approx(10.8 + gap - 0.01, abs=5e-3)


def test_a_disk_load_dearer_than_recompute_recomputes_on_the_same_node():
    gap = 103.2 - 0.8
    d = disk_router(gap + 0.01).choose(query(), [on_disk("b")])
    assert d.node_id == "b" and d.cached_blocks == 0 and d.promote_blocks == 0 and d.disk_blocks == 0
    assert d.promote_ms == 0 and d.prefill_ms == pytest.approx(10 + 103.2)


def test_disk_blocks_cost_more_than_host_hits():
    host_only = cand("h", cached=64)
    host_only.host_blocks = 64
    r = disk_router(5.0)
    assert r.estimate(query(), on_disk("d"), None).promote_ms > r.estimate(query(), host_only, None).promote_ms
    # Without a disk model, disk blocks are priced as host hits (as before disks were priced).
    plain = KvAwareRouter(PROFILE, LinkModel(0.001, overhead_ms=1.0), host_link=HOST)
    assert plain.estimate(query(), on_disk("d"), None).promote_ms == pytest.approx(
        plain.estimate(query(), host_only, None).promote_ms)


def test_a_disk_load_waits_for_the_reads_booked_on_its_disk():
    """disk_wait_ms (disk_backlog.py) is on the load's critical path: with a
    50 ms read, a 40 ms wait still loads (90 < 102.4), a 60 ms wait makes
    the node recompute instead (110 > 102.4)."""
    r = disk_router(50.0)
    short, long_ = on_disk("b"), on_disk("b")
    short.disk_wait_ms, long_.disk_wait_ms = 40.0, 60.0
    loads = r.choose(query(), [short])
    assert loads.cached_blocks == 64 and loads.promote_ms == pytest.approx(90.0, abs=5e-3)
    assert not loads.disk_joined
    assert r.choose(query(), [long_]).cached_blocks == 0


def test_a_load_joining_a_stage_in_flight_waits_for_its_end_and_reads_nothing_itself():
    """When a stage in flight reads the very prefix (disk_joined), the disk
    term is that stage's remaining time alone: 60 ms left of it loads, where
    60 ms of other reads plus a 50 ms read of its own recompute."""
    r = disk_router(50.0)
    c = on_disk("b")
    c.disk_wait_ms, c.disk_joined = 60.0, True
    d = r.choose(query(), [c])
    assert d.cached_blocks == 64 and d.disk_blocks == 64 and d.disk_joined
    assert d.promote_ms == pytest.approx(60.0, abs=5e-3)


def ahead_router(gbps=25.0, budget=512):
    return KvAwareRouter(PROFILE, LinkModel(gbps, overhead_ms=1.0), prefill_ahead_weight=1.0,
                         prefill_ahead_budget_tokens=budget)


def test_the_prefill_ahead_charge_sends_a_long_new_prompt_past_requests_still_fetching():
    # a has two requests routed there that join its engine queue in 50 and 80 ms (their pulls first); b is 5 ms
    # busier. A new 1,032-token prompt (113 ms of prefill everywhere) would go ahead of both on a.
    fetching = Candidate(NodeId("a"), 2, 0, GEO.block_size, GEO.bytes_per_block, 0.0, entering_ms=(50.0, 80.0))
    busier = Candidate(NodeId("b"), 0, 0, GEO.block_size, GEO.bytes_per_block, 5.0)
    assert router().choose(query(), [fetching, busier]).node_id == "a"  # off: its own TTFT alone
    decision = ahead_router(budget=512).choose(query(), [fetching, busier])
    # charged 2 x 113.2 ms x (1032 - 512) / 1032 = 114 ms at a: b
    assert decision.node_id == "b"
    assert decision.expected_ttft_ms == pytest.approx(5.0 + 10 + 0.1 * 1032)  # the request's own, uncharged
    # within one step's budget it shares its step with them: no charge
    assert ahead_router(budget=2048).choose(query(), [fetching, busier]).node_id == "a"


def test_the_charge_counts_only_requests_that_would_join_after_this_one():
    # The request pulls 64 blocks from holder h (~11 ms over 100 Gb/s before its prefill of 4,000 new tokens),
    # so at a it joins the queue after the request entering in 5 ms and before the one entering in 300 ms.
    long = RouteQuery("r", list(range(1, 65)), 64 * 16 + 4000, Family("f"))
    holder = cand("h", cached=64, queued=200_000)
    a = Candidate(NodeId("a"), 2, 0, GEO.block_size, GEO.bytes_per_block, 0.0, entering_ms=(5.0, 300.0))
    charged = ahead_router(gbps=100.0)
    pull = charged.estimate(long, a, holder)
    assert pull.fetch_from == "h" and 5.0 < pull.fetch_ms < 300.0
    one = pull.prefill_ms * (4000 - 512) / 4000  # one charged request
    # b pulls the same way with no one fetching there. Busier than a by half a charge, it wins; by one and a
    # half, a wins: the request entering in 5 ms is not charged.
    b = Candidate(NodeId("b"), 0, 0, GEO.block_size, GEO.bytes_per_block, one * 0.5)
    assert charged.choose(long, [a, b, holder]).node_id == "b"
    b_far = Candidate(NodeId("b"), 0, 0, GEO.block_size, GEO.bytes_per_block, one * 1.5)
    assert charged.choose(long, [a, b_far, holder]).node_id == "a"
