"""P(reuse) of blocks pushed out of a tier, from ghost hits (reuse_history.py)."""
import pytest

from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.reuse_history import ReuseHistory, ReuseSettings

A, B = NodeId("a"), NodeId("b")


def test_a_fresh_node_reads_the_prior():
    history = ReuseHistory(ReuseSettings(prior_p=0.3, prior_weight=4.0))
    assert history.p_reuse(A, Tier.DEVICE, 0.0) == pytest.approx(0.3)


def test_ghosts_wanted_within_the_window_are_hits_of_their_node_and_tier():
    history = ReuseHistory(ReuseSettings(window_s=60.0, halflife_s=1e9, prior_p=0.5, prior_weight=4.0))
    history.removed(A, Tier.HOST, list(range(10)), now=0.0)
    assert history.wanted([0, 1, 2, 3, 99], now=30.0) == 4
    assert history.wanted([0, 1], now=31.0) == 0  # a ghost counts once
    # (4 hits + 4 x 0.5) / (10 removed + 4)
    assert history.p_reuse(A, Tier.HOST, 31.0) == pytest.approx(6.0 / 14.0)
    assert history.p_reuse(A, Tier.DEVICE, 31.0) == pytest.approx(0.5)
    assert history.p_reuse(B, Tier.HOST, 31.0) == pytest.approx(0.5)


def test_a_ghost_wanted_after_its_window_is_no_hit():
    history = ReuseHistory(ReuseSettings(window_s=60.0, halflife_s=1e9, prior_p=0.5, prior_weight=4.0))
    history.removed(A, Tier.DEVICE, [1, 2], now=0.0)
    assert history.wanted([1, 2], now=61.0) == 0
    assert history.p_reuse(A, Tier.DEVICE, 61.0) == pytest.approx(2.0 / 6.0)


def test_counts_decay_with_their_half_life():
    history = ReuseHistory(ReuseSettings(window_s=60.0, halflife_s=10.0, prior_p=0.5, prior_weight=4.0))
    history.removed(A, Tier.DEVICE, list(range(8)), now=0.0)
    history.wanted(list(range(8)), now=0.0)  # 8 of 8: p = (8 + 2) / (8 + 4)
    assert history.p_reuse(A, Tier.DEVICE, 0.0) == pytest.approx(10.0 / 12.0)
    # one half-life later the history weighs 4 hits of 4: (4 + 2) / (4 + 4)
    assert history.p_reuse(A, Tier.DEVICE, 10.0) == pytest.approx(6.0 / 8.0)


def test_the_ghost_map_is_bounded_oldest_first():
    history = ReuseHistory(ReuseSettings(max_ghosts=3))
    history.removed(A, Tier.DEVICE, [1, 2, 3, 4], now=0.0)
    assert history.wanted([1], now=1.0) == 0
    assert history.wanted([2, 3, 4], now=1.0) == 3


def test_a_node_that_left_forgets_its_history():
    history = ReuseHistory(ReuseSettings(halflife_s=1e9, prior_p=0.5, prior_weight=4.0))
    history.removed(A, Tier.DEVICE, list(range(100)), now=0.0)
    assert history.p_reuse(A, Tier.DEVICE, 0.0) < 0.1
    history.forget(A)
    assert history.p_reuse(A, Tier.DEVICE, 0.0) == pytest.approx(0.5)


def test_a_demoted_block_wanted_on_its_node_is_a_hit_it_pays_a_promotion_for():
    history = ReuseHistory(ReuseSettings(window_s=60.0, halflife_s=1e9, prior_p=0.5, prior_weight=4.0))
    history.removed(A, Tier.DEVICE, [10, 11], now=0.0)
    history.removed(B, Tier.DEVICE, [12], now=0.0)
    # Served from a's host tier (cached there): a's demotions cost a promotion; b's block
    # was served by a from its own cache, so b's demotion cost nothing.
    assert history.wanted([10, 11, 12], now=5.0, recomputed_from=3, routed_to=A) == 2


def test_a_ghost_served_from_a_cache_anyway_is_no_hit():
    history = ReuseHistory(ReuseSettings(window_s=60.0, halflife_s=1e9, prior_p=0.5, prior_weight=4.0))
    history.removed(A, Tier.HOST, [10, 11, 12, 13], now=0.0)
    # The routed node had the first two blocks cached: only 12 and 13 were computed again.
    assert history.wanted([10, 11, 12, 13], now=5.0, recomputed_from=2) == 2
    assert history.wanted([10, 11], now=6.0) == 0  # forgotten either way


def test_a_re_registered_node_keeps_no_old_ghosts():
    history = ReuseHistory(ReuseSettings(halflife_s=1e9, prior_p=0.5, prior_weight=4.0))
    history.removed(A, Tier.DEVICE, [1, 2, 3], now=0.0)
    history.removed(B, Tier.DEVICE, [4], now=0.0)
    history.forget(A)
    assert history.wanted([1, 2, 3, 4], now=1.0) == 1  # only b's ghost is left
    assert history.p_reuse(A, Tier.DEVICE, 1.0) == pytest.approx(0.5)


@pytest.mark.parametrize("elapsed_s", [10.0, 300.0, 3000.0])
def test_removal_rate_reads_a_steady_rate_however_recently_counting_began(elapsed_s):
    history = ReuseHistory(ReuseSettings(halflife_s=300.0))
    assert history.removal_rate(A, Tier.HOST, 0.0) == 0.0
    step = 0.5
    for k in range(int(elapsed_s / step)):
        history.removed(A, Tier.HOST, [k * 10 + i for i in range(5)], now=k * step)  # 10 blocks/s
    rate = history.removal_rate(A, Tier.HOST, elapsed_s - step)
    assert rate == pytest.approx(10.0, rel=0.06)  # the first batch lands at t = 0: a half-step's excess
    assert history.removal_rate(A, Tier.DEVICE, elapsed_s) == 0.0


def test_a_host_ghost_found_on_its_node_again_is_a_hit_it_paid_a_disk_load_for():
    """Issue 44: a block the host tier wrote down to the disk, wanted on the
    same node and found cached there, came off the disk: its eviction cost."""
    history = ReuseHistory(ReuseSettings(window_s=60.0, halflife_s=1e9, prior_p=0.5, prior_weight=4.0))
    history.removed(A, Tier.HOST, [10, 11], now=0.0)
    history.removed(B, Tier.HOST, [12], now=0.0)
    assert history.wanted([10, 11, 12], now=5.0, recomputed_from=3, routed_to=A) == 2


def test_a_block_removed_again_is_the_newest_ghost_of_its_latest_node():
    history = ReuseHistory(ReuseSettings(max_ghosts=3))
    history.removed(A, Tier.DEVICE, [1, 2, 3], now=0.0)
    history.removed(B, Tier.HOST, [1], now=1.0)  # 1 again: now the newest ghost, B's
    history.removed(A, Tier.DEVICE, [4], now=2.0)  # pushes out the oldest: 2, not 1
    assert history.wanted([2], now=3.0) == 0
    assert history.wanted([1, 3, 4], now=3.0) == 3
    assert history.p_reuse(B, Tier.HOST, 3.0) > history.p_reuse(B, Tier.DEVICE, 3.0)
