"""MemoryKeys keeps etcd's semantics: one revision bumped per write,
create_revision per key, leases that lapse ttl past their last keep-alive
(at least the minimum TTL), fenced txns applied whole or not at all."""
from __future__ import annotations

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.scheduler.leadership.memory_keys import MemoryKeys


@pytest.fixture
def clock():
    return ManualClock()


def test_a_lease_lapses_ttl_after_its_last_keep_alive_taking_its_keys(clock):
    keys = MemoryKeys(clock)
    lease, ttl = keys.grant(1)
    assert ttl == 2  # raised to the minimum, as etcd does
    assert keys.campaign("k", b"v", lease).won
    clock.advance(1.9)
    assert keys.keep_alive(lease) == 2
    clock.advance(1.9)
    assert keys.read("k") is not None
    clock.advance(0.1)
    assert keys.read("k") is None and keys.keep_alive(lease) == -1


def test_a_key_made_again_has_a_larger_create_revision(clock):
    keys = MemoryKeys(clock)
    first, _ = keys.grant(2)
    made = keys.campaign("k", b"a", first).holder.create_revision
    second, _ = keys.grant(2)
    lost = keys.campaign("k", b"b", second)
    assert not lost.won and lost.holder.value == b"a"
    keys.revoke(first)
    again = keys.campaign("k", b"b", second)
    assert again.won and again.holder.create_revision > made and again.holder.lease == second


def test_a_campaign_on_a_lease_that_is_gone_fails(clock):
    keys = MemoryKeys(clock)
    lease, _ = keys.grant(2)
    keys.revoke(lease)
    with pytest.raises(ValueError, match="lease"):
        keys.campaign("k", b"v", lease)


def test_a_fenced_write_applies_whole_only_at_the_fence_keys_create_revision(clock):
    keys = MemoryKeys(clock)
    lease, _ = keys.grant(2)
    epoch = keys.campaign("fence", b"", lease).holder.create_revision
    assert keys.write_fenced("fence", epoch, {"s/a": b"1", "s/b": b"2"}, [])
    assert not keys.write_fenced("fence", epoch + 1, {"s/a": b"X"}, ["s/b"])
    assert keys.write_fenced("fence", epoch, {"s/c": b"3"}, ["s/a"])
    assert keys.read_prefix("s/") == [("s/b", b"2"), ("s/c", b"3")]
    with pytest.raises(ValueError, match="duplicate"):
        keys.write_fenced("fence", epoch, {"s/b": b"4"}, ["s/b"])
    keys.revoke(lease)
    assert not keys.write_fenced("fence", epoch, {"s/d": b"4"}, [])
    assert keys.write_fenced("fence", 0, {"s/d": b"4"}, [])  # etcd's compare: an absent key's create_revision is 0
