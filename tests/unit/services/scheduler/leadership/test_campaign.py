"""The election's state machine (campaign.ElectionCore) against etcd's
semantics in memory (MemoryKeys) on one virtual clock: who leads, epochs,
stepping down before the lease can lapse, failover, resign."""
from __future__ import annotations

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import Unavailable
from speckv.services.scheduler.leadership.campaign import STEP_DOWN_AT, ElectionCore, decode_holder, encode_holder
from speckv.services.scheduler.leadership.keys import leader_key
from speckv.services.scheduler.leadership.memory_keys import MemoryKeys

KEY = leader_key("test")
TTL = 2


class Cut:
    """MemoryKeys behind a link that can be cut: every call raises
    Unavailable while cut (a partition between one replica and etcd)."""

    def __init__(self, keys: MemoryKeys) -> None:
        self.keys, self.cut = keys, False

    def __getattr__(self, name):
        method = getattr(self.keys, name)

        def call(*args):
            if self.cut:
                raise Unavailable("etcd unreachable (link cut)")
            return method(*args)
        return call


@pytest.fixture
def clock():
    return ManualClock(1000.0)


@pytest.fixture
def keys(clock):
    return MemoryKeys(clock)


def core(keys, clock, name):
    return ElectionCore(keys, KEY, name, f"{name}:50051", TTL, clock)


def run(clock, cores, seconds, on_round=None):
    """Steps every core once a round (TTL/3) for `seconds` of virtual time."""
    t_end = clock.now() + seconds
    while clock.now() < t_end:
        for c in cores:
            c.step()
        if on_round:
            on_round()
        clock.advance(TTL / 3)


def test_first_to_campaign_leads_and_the_other_follows_it(keys, clock):
    a, b = core(keys, clock, "a"), core(keys, clock, "b")
    a.step()
    b.step()
    la, lb = a.current(), b.current()
    assert la.is_leader and la.leader_id == "a" and la.epoch == keys.read(KEY).create_revision > 0
    assert not lb.is_leader and (lb.epoch, lb.leader_id, lb.leader_address) == (la.epoch, "a", "a:50051")


def test_a_leader_that_keeps_its_lease_alive_leads_on_at_the_same_epoch(keys, clock):
    a, b = core(keys, clock, "a"), core(keys, clock, "b")
    a.step()
    epoch = a.current().epoch
    leaders = []
    run(clock, [a, b], 10 * TTL, lambda: leaders.append((a.current().is_leader, b.current().is_leader)))
    assert set(leaders) == {(True, False)}
    assert a.current().epoch == epoch


def test_a_crashed_leaders_key_lapses_and_a_follower_leads_within_two_leases_at_a_larger_epoch(keys, clock):
    a, b = core(keys, clock, "a"), core(keys, clock, "b")
    run(clock, [a, b], TTL)
    old = a.current().epoch
    crashed_at = clock.now()  # a stops stepping: no keep-alive from now on
    while not b.current().is_leader:
        b.step()
        clock.advance(TTL / 3)
    assert clock.now() - crashed_at <= 2 * TTL
    assert b.current().epoch > old
    assert not a.current().is_leader  # its own view lapsed too, without a round


def test_a_partitioned_leader_steps_down_before_its_lease_can_lapse_on_the_server(keys, clock):
    link = Cut(keys)
    a, b = ElectionCore(link, KEY, "a", "", TTL, clock), core(keys, clock, "b")
    run(clock, [a, b], TTL)
    epoch = a.current().epoch
    link.cut = True
    key_stood_at_step_down = None
    while not b.current().is_leader:
        a.step()
        if not a.current().is_leader and key_stood_at_step_down is None:
            held = keys.read(KEY)  # what the server holds when `a` stops believing it leads
            key_stood_at_step_down = held is not None and held.create_revision == epoch
        b.step()
        assert not (a.current().is_leader and b.current().is_leader)
        clock.advance(TTL / 6)
    assert key_stood_at_step_down is True
    assert b.current().epoch > epoch
    link.cut = False
    run(clock, [a, b], 3 * TTL)
    assert not a.current().is_leader and a.current().leader_id == "b"


def test_current_is_not_leading_past_the_valid_until_even_without_a_round(keys, clock):
    a = core(keys, clock, "a")
    a.step()
    assert a.current().is_leader
    clock.advance(TTL * STEP_DOWN_AT)
    assert not a.current().is_leader and keys.read(KEY) is not None  # the server's lease still runs


def test_a_leader_whose_lease_is_gone_steps_down_and_never_reclaims_its_epoch(keys, clock):
    a = core(keys, clock, "a")
    a.step()
    first = a.current().epoch
    keys.revoke(keys.read(KEY).lease)  # an operator (or etcd) ended its lease
    a.step()  # keep-alive says gone: a new lease, and a campaign on the now absent key
    assert a.current().is_leader and a.current().epoch > first


def test_a_leader_key_replaced_under_another_lease_deposes_the_leader(keys, clock):
    a, b = core(keys, clock, "a"), core(keys, clock, "b")
    a.step()
    keys.revoke(keys.read(KEY).lease)
    b.step()  # b takes the key before a's next round
    a.step()
    assert not a.current().is_leader and a.current().leader_id == "b"
    assert b.current().is_leader and b.current().epoch == keys.read(KEY).create_revision


def test_resign_hands_the_lead_to_another_replica(keys, clock):
    a, b = core(keys, clock, "a"), core(keys, clock, "b")
    run(clock, [a, b], TTL)
    old = a.current().epoch
    a.resign()
    assert not a.current().is_leader and keys.read(KEY) is None
    run(clock, [a, b], TTL)
    assert b.current().is_leader and b.current().epoch > old
    assert not a.current().is_leader and a.current().leader_id == "b"


def test_resign_by_a_follower_changes_nothing(keys, clock):
    a, b = core(keys, clock, "a"), core(keys, clock, "b")
    run(clock, [a, b], TTL)
    b.resign()
    run(clock, [a, b], TTL)
    assert a.current().is_leader


def test_close_without_revoke_leaves_the_key_to_expire(keys, clock):
    a, b = core(keys, clock, "a"), core(keys, clock, "b")
    a.step()
    a.close(revoke=False)
    assert not a.current().is_leader and keys.read(KEY) is not None
    run(clock, [b], 2 * TTL)
    assert b.current().is_leader


def test_the_round_is_a_third_of_the_lease_the_server_granted(keys, clock):
    a = ElectionCore(keys, KEY, "a", "", 1, clock)  # MemoryKeys grants at least 2 s, as etcd does
    assert a.step() == pytest.approx(2 / 3)
    assert a.round_s() == pytest.approx(2 / 3)


def test_settings_are_checked():
    keys = MemoryKeys(ManualClock())
    with pytest.raises(ValueError, match="whole seconds"):
        ElectionCore(keys, KEY, "a", "", 0, ManualClock())
    with pytest.raises(ValueError, match="replica id"):
        ElectionCore(keys, KEY, "", "", 2, ManualClock())


def test_the_holder_value_round_trips_and_a_foreign_one_reads_as_unknown():
    assert decode_holder(encode_holder("r1", "h:1")) == ("r1", "h:1")
    assert decode_holder(b"\xff not json") == ("", "")
    assert decode_holder(b'{"id": "x"}') == ("", "")
