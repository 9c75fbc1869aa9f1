from __future__ import annotations

import pytest

from speckv.services.common.cost_table import CostTable, Segment, where_negative
from speckv.services.common.engine_profile import EngineProfile, LinkModel
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import KVGeometry

# 2 x 1 layer x 1 KV head x 64 dims x 2 B = 256 B of KV per token, 2,048 bits.
GEOMETRY = KVGeometry(num_layers=1, num_kv_heads=1, head_dim=64, dtype="float16", block_size=16)
BITS_PER_TOKEN = 2048


def profile(overhead_ms=2.0, ms_per_token=0.02, pair=1e-6, tp=1) -> EngineProfile:
    return EngineProfile("scripted", "m", "hw", overhead_ms, ms_per_token, pair, GEOMETRY, tensor_parallel=tp)


def link(ms_per_token: float, overhead_ms: float) -> LinkModel:
    """A link that moves this geometry's KV at exactly ms_per_token."""
    return LinkModel(BITS_PER_TOKEN / (ms_per_token * 1e6), overhead_ms)


# By hand: recompute - pull = (a - k)(P - 1) + c P (P - 1) / 2 - L  (module docstring), with
# a = ms_per_token, k = the link's ms per token, c = the pair term, L = the link's overhead.

def test_slow_link_without_overhead_recompute_wins_below_twice_the_gap_over_the_pair_term():
    # a = 0.02, k = 0.04, c = 3e-6, L = 0: (P - 1)(1.5e-6 P - 0.02) < 0  <=>  1 < P < 13,333.3.
    table = CostTable(profile(pair=3e-6), link(0.04, 0.0))
    assert table.beats("recompute", "pull") == (2, 13333)


def test_slow_link_with_overhead_recompute_wins_from_the_first_token():
    # L = 1: (P - 1)(5e-7 P - 0.02) < 1. The root of 5e-7 P^2 - 0.0200005 P - 0.98 = 0 is
    # P = (0.0200005 + sqrt(0.0200005^2 + 4 * 5e-7 * 0.98)) / 1e-6 = 40,049.94.
    table = CostTable(profile(), link(0.04, 1.0))
    assert table.beats("recompute", "pull") == (1, 40049)


def test_fast_link_recompute_wins_only_while_the_transfer_overhead_dominates():
    # a = 0.02, k = 0.01, L = 1: (P - 1)(0.01 + 5e-7 P) < 1; P = 100 gives 99 x 0.01005 = 0.995,
    # P = 101 gives 100 x 0.0100505 = 1.005.
    table = CostTable(profile(), link(0.01, 1.0))
    assert table.beats("recompute", "pull") == (1, 100)


def test_no_pair_term_and_a_slower_link_recompute_always_wins():
    assert CostTable(profile(pair=0.0), link(0.04, 1.0)).beats("recompute", "pull") == (1, None)


def test_a_fast_link_without_overhead_never_loses():
    # a > k and L = 0: the difference is 0 at P = 1 and positive after.
    assert CostTable(profile(), link(0.01, 0.0)).beats("recompute", "pull") is None


def test_the_crossovers_agree_with_the_models_themselves():
    table = CostTable(profile(), link(0.04, 1.0), link(0.002, 0.05))
    low, high = table.beats("recompute", "pull")
    assert table.cost_ms("recompute", high) < table.cost_ms("pull", high)
    assert table.cost_ms("recompute", high + 1) >= table.cost_ms("pull", high + 1)
    for path in table.paths:
        for p in (1, 2, 17, 4096, 50000):
            q2, q1, q0 = table.quadratic(path)
            assert table.cost_ms(path, p) == pytest.approx(q2 * p * p + q1 * p + q0)


def test_prices_per_token_and_fixed_costs():
    table = CostTable(profile(), link(0.04, 1.0), link(0.002, 0.05))
    assert table.ms_per_token("recompute") == 0.02
    assert table.ms_per_token("pull") == pytest.approx(0.04)
    assert table.ms_per_token("promote") == pytest.approx(0.002)
    assert (table.fixed_ms("recompute"), table.fixed_ms("pull"), table.fixed_ms("promote")) == (2.0, 1.0, 0.05)


def test_promotion_against_a_pull_splits_at_one_length():
    # Both transfers: promote beats pull where 0.05 + 0.002 (P - 1) < 1 + 0.04 (P - 1): always.
    table = CostTable(profile(), link(0.04, 1.0), link(0.002, 0.05))
    assert table.beats("promote", "pull") == (1, None)
    assert table.beats("pull", "promote") is None
    # A host link slower per token but cheaper to start: 0.05 + 0.05 (P - 1) < 1 + 0.04 (P - 1)
    # <=> P - 1 < 95.
    slow_host = CostTable(profile(), link(0.04, 1.0), link(0.05, 0.05))
    assert slow_host.beats("promote", "pull") == (1, 95)


def test_cheapest_segments_cover_every_length_once():
    table = CostTable(profile(), link(0.04, 1.0), link(0.002, 0.05))
    peer_only = table.cheapest(100000, ("recompute", "pull"))
    assert peer_only == [Segment("recompute", 1, 40049), Segment("pull", 40050, 100000)]
    every = table.cheapest(1000)
    assert every[0].low == 1 and every[-1].high == 1000
    assert all(a.high + 1 == b.low for a, b in zip(every, every[1:]))
    assert {s.path for s in every} == {"recompute", "promote"}


def test_without_a_host_tier_there_is_no_promote_path():
    table = CostTable(profile(), link(0.04, 1.0))
    assert table.paths == ("recompute", "pull")
    with pytest.raises(InvalidArgument):
        table.ms_per_token("promote")


def test_a_transfer_against_recompute_is_refused_the_wrong_way_round():
    with pytest.raises(InvalidArgument, match="other way round"):
        CostTable(profile(), link(0.04, 1.0)).beats("pull", "recompute")


@pytest.mark.parametrize("q, expected", [
    ((0.0, 1.0, -10.0), (1, 9)),        # P - 10 < 0
    ((0.0, -1.0, 10.5), (11, None)),    # 10.5 - P < 0
    ((0.0, 0.0, -1.0), (1, None)),
    ((0.0, 0.0, 1.0), None),
    ((1.0, -10.0, 21.0), (4, 6)),       # (P - 3)(P - 7) < 0
    ((1.0, 0.0, 1.0), None),
    ((1.0, -2.0, 0.0), (1, 1)),         # P (P - 2) < 0 at P = 1 alone
    ((1.0, -2.5, 1.5), None),           # (P - 1)(P - 1.5) < 0 between two whole numbers
])
def test_where_negative_by_hand(q, expected):
    assert where_negative(*q) == expected


# The disk's load: its read, then the host link's copy (disks.serial), then the last token's prefill.
# a = 2^-5, the two copies 2^-7 each (k = 2^-6), no pair term: recompute - load = 2^-6 (P - 1) - L,
# with L the two overheads: a tie at P = 65 when L = 1.

def _disk_table(disk_overhead_ms: float) -> CostTable:
    return CostTable(profile(overhead_ms=2.0, ms_per_token=2 ** -5, pair=0.0), link(0.04, 1.0),
                     host_link=link(2 ** -7, 0.5), disk=link(2 ** -7, disk_overhead_ms))


def test_load_path_is_disk_then_host_link():
    table = _disk_table(0.5)
    assert table.paths == ("recompute", "promote", "load", "pull")
    assert table.ms_per_token("load") == pytest.approx(2 ** -6)
    assert table.fixed_ms("load") == pytest.approx(1.0)
    assert table.cost_ms("load", 100) == pytest.approx(1.0 + 99 * 2 ** -6 + table.profile.prefill_ms(1, 99))


def test_load_strictly_beats_recompute_one_token_later_when_the_disk_costs_a_hair_more():
    below, above = _disk_table(0.5 - 1e-9), _disk_table(0.5 + 1e-9)
    assert below.beats_recompute("load") == (65, None)
    assert above.beats_recompute("load") == (66, None)
    assert above.cost_ms("load", 65) > above.cost_ms("recompute", 65)
    assert above.cost_ms("load", 66) < above.cost_ms("recompute", 66)
    assert below.cost_ms("load", 65) < below.cost_ms("recompute", 65)


def test_a_disk_without_a_host_tier_is_refused():
    with pytest.raises(InvalidArgument, match="needs a host tier"):
        CostTable(profile(), link(0.04, 1.0), disk=link(0.01, 0.1))
