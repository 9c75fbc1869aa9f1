"""Retention: deadlines per block, a cap on how many, expiry and release."""
import pytest

from speckv.services.common.retention import Retention


def test_retains_a_chain_until_its_deadline():
    r = Retention(max_blocks=10)
    assert r.retain([1, 2, 3], until=20.0, now=10.0) == 3
    assert all(r.holds(h, 19.9) for h in (1, 2, 3))
    assert not any(r.holds(h, 20.0) for h in (1, 2, 3))  # the deadline itself is past
    assert not r.holds(4, 10.0)


def test_the_cap_retains_the_head_of_a_chain_only():
    r = Retention(max_blocks=3)
    assert r.retain([1, 2], until=50.0, now=0.0) == 2
    assert r.retain([7, 8, 9], until=50.0, now=0.0) == 1  # one slot left: the head
    assert r.holds(7, 1.0) and not r.holds(8, 1.0) and not r.holds(9, 1.0)
    assert len(r) == 3


@pytest.mark.parametrize("first, second, kept", [(30.0, 20.0, 30.0), (20.0, 30.0, 30.0)])
def test_deadlines_only_grow(first, second, kept):
    r = Retention(max_blocks=1)
    r.retain([5], until=first, now=0.0)
    assert r.retain([5], until=second, now=0.0) == 1  # already retained: no new slot needed
    assert r.holds(5, kept - 0.1) and not r.holds(5, kept)


def test_expired_retentions_free_their_slots():
    r = Retention(max_blocks=2)
    r.retain([1, 2], until=10.0, now=0.0)
    assert r.retain([3], until=30.0, now=5.0) == 0  # full
    assert r.retain([3], until=30.0, now=10.0) == 1  # 1 and 2 lapsed at 10
    assert len(r) == 1


def test_release_forgets_blocks_that_left_and_frees_their_slots():
    r = Retention(max_blocks=2)
    r.retain([1, 2], until=10.0, now=0.0)
    r.release([1, 99])
    assert not r.holds(1, 1.0) and r.holds(2, 1.0)
    assert r.retain([3], until=10.0, now=1.0) == 1


@pytest.mark.parametrize("max_blocks", [0, 1])
def test_a_deadline_not_in_the_future_or_no_room_retains_nothing(max_blocks):
    r = Retention(max_blocks=max_blocks)
    assert r.retain([1], until=5.0, now=5.0) == 0
    assert not r and len(r) == 0


def test_a_negative_cap_is_refused():
    with pytest.raises(ValueError):
        Retention(-1)


@pytest.mark.parametrize("held, chain, now", [
    ([], [], 0.0), ([], [1], 0.0), ([1, 2], [1, 2, 3, 4, 5], 0.0), ([1, 2], [3, 1, 4, 2, 5, 6], 0.0),
    ([1, 2, 3], [4, 5], 0.0), ([1, 2, 3], [1, 2, 3], 0.0), ([1, 2, 3], [4, 5, 6, 7], 60.0),
    ([1, 2], [3, 3, 4], 0.0), ([1, 2, 3], [4, 4, 5], 0.0)])
def test_fits_says_what_retain_would_keep_and_keeps_nothing(held, chain, now):
    r, twin = Retention(max_blocks=4), Retention(max_blocks=4)
    for retention in (r, twin):
        retention.retain(held, until=50.0, now=0.0)
    fits = r.fits(chain, now)
    assert [r.holds(h, now) for h in range(1, 8)] == [twin.holds(h, now) for h in range(1, 8)]  # unchanged
    assert fits == twin.retain(chain, until=100.0, now=now)


@pytest.mark.parametrize("store_count, expected", [
    (0, 3), (1, 3), (2, 3),  # no more than this Retention holds, or one more: room for the 2 new blocks
    (3, 2), (4, 1), (9, 1)])  # the others fill the cap (or overrun it): block 1, retained already, still fits
def test_fits_counts_the_stores_other_retains_against_the_cap(store_count, expected):
    r = Retention(max_blocks=4)
    r.retain([1], until=50.0, now=0.0)
    assert r.fits([1, 2, 3], now=0.0, store_count=store_count) == expected


def test_lapsed_since_counts_what_lapsed_after_a_time_within_the_log():
    r = Retention(max_blocks=8, lapse_log_s=10.0)
    r.retain([1, 2], until=5.0, now=0.0)
    r.retain([3], until=7.0, now=0.0)
    r.retain([4], until=50.0, now=0.0)
    r.purge(8.0)
    assert (r.lapsed_since(4.0), r.lapsed_since(6.0), r.lapsed_since(7.0)) == (3, 1, 0)
    r.purge(16.0)  # 5.0 is more than 10 s back now: forgotten
    assert r.lapsed_since(0.0) == 1
    assert r.fits([9, 10], now=16.0, store_count=8, counted_at=6.5) == 1  # 8 counted, 1 (3) lapsed since: 7 others
    # A renewal is no lapse; a count made before the lapse is corrected by it.
    r.retain([4], until=60.0, now=16.0)
    r.purge(55.0)  # 4's first deadline, 50, has passed, but it was renewed to 60
    assert r.lapsed_since(16.0) == 0 and r.holds(4, 55.0)
    r.purge(61.0)
    assert r.lapsed_since(16.0) == 1
    r = Retention(max_blocks=8, lapse_log_s=100.0)
    r.retain([3], until=7.0, now=0.0)
    r.retain([4, 5], until=20.0, now=0.0)
    r.purge(20.0)
    r.retain([1], until=15.0, now=5.0)  # a caller whose now went back
    r.purge(16.0)
    assert (r.lapsed_since(10.0), r.lapsed_since(16.0)) == (3, 2)  # the log in order: 7, 15, 20, 20
    assert Retention(max_blocks=8).lapsed_since(0.0) == 0  # no log kept
