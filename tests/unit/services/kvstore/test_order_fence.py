from __future__ import annotations

import pytest

from speckv.services.kvstore.order_fence import Admission, OrderFence


def test_an_order_runs_once():
    fence = OrderFence()
    assert fence.admit("o-1", 0) is Admission.RUN
    assert fence.admit("o-1", 0) is Admission.DUPLICATE
    assert fence.refused[Admission.DUPLICATE] == 1


def test_an_older_epoch_is_stale_once_a_newer_one_was_seen():
    fence = OrderFence()
    assert fence.admit("o-1", 5) is Admission.RUN
    assert fence.admit("o-2", 4) is Admission.STALE  # a deposed leader's order
    assert fence.admit("o-3", 5) is Admission.RUN
    fence.saw_epoch(9)  # a heartbeat reply from the new leader, before any of its orders
    assert fence.admit("o-4", 5) is Admission.STALE
    assert fence.admit("o-4", 9) is Admission.RUN
    assert fence.refused[Admission.STALE] == 2


def test_the_newest_epoch_never_goes_down():
    fence = OrderFence()
    fence.saw_epoch(7)
    fence.saw_epoch(3)
    assert fence.newest_epoch == 7


def test_epoch_zero_is_unfenced_until_an_election_is_seen():
    fence = OrderFence()
    assert fence.admit("o-1", 0) is Admission.RUN
    fence.saw_epoch(2)
    assert fence.admit("o-2", 0) is Admission.STALE


def test_a_new_leader_resending_an_adopted_order_does_not_run_it_again():
    fence = OrderFence()
    assert fence.admit("o-1", 3) is Admission.RUN
    assert fence.admit("o-1", 8) is Admission.DUPLICATE
    assert fence.newest_epoch == 8  # its sender leads now: the old leader is fenced from here on
    assert fence.admit("o-2", 3) is Admission.STALE


def test_ids_are_remembered_up_to_capacity():
    fence = OrderFence(capacity=2)
    for order_id in ("o-1", "o-2", "o-3"):
        assert fence.admit(order_id, 0) is Admission.RUN
    assert fence.admit("o-1", 0) is Admission.RUN  # forgotten: the oldest goes first
    assert fence.admit("o-3", 0) is Admission.DUPLICATE


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        OrderFence(capacity=0)
