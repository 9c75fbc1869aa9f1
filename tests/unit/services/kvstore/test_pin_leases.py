"""Pins with a lease (KVStoreCore.pin(lease_s=...)): maintenance ends a pin
once its lease has passed; unpin ends the pin that lapses first, so no other
holder's pin ends early; a client cannot unpin what a reader pinned."""
from __future__ import annotations

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from tests.support.kvstore_service import make_store, writes


def test_maintenance_releases_a_pin_once_its_lease_has_passed():
    clock = ManualClock(1000.0)
    store = make_store(num_pages=2, clock=clock)
    store.put_blocks(writes(1, 2))
    store.pin([1, 2], lease_s=30.0)
    clock.advance(29.0)
    store.maintenance()
    assert store.stats().pinned_pages == 2
    with pytest.raises(ResourceExhausted, match="2 pinned"):
        store.put_blocks(writes(3))
    clock.advance(1.0)
    store.maintenance()
    assert store.stats().pinned_pages == 0
    assert store.put_blocks(writes(3)).evicted == 1  # evictable again: the chain's tail, 2, went
    with pytest.raises(FailedPrecondition, match="not pinned"):
        store.unpin([1])


def test_unpin_ends_the_pin_that_lapses_first():
    clock = ManualClock(1000.0)
    store = make_store(num_pages=2, clock=clock)
    store.put_blocks(writes(1))
    store.pin([1], lease_s=10.0)  # holder A
    clock.advance(5.0)
    store.pin([1], lease_s=10.0)  # holder B, until t+15
    store.unpin([1])  # whoever unpins, the pin left lasts to B's deadline
    clock.advance(9.0)  # t+14: past A's deadline, before B's
    store.maintenance()
    assert store.stats().pinned_pages == 1
    clock.advance(1.0)
    store.maintenance()
    assert store.stats().pinned_pages == 0


def test_pinning_again_and_unpinning_once_renews():
    clock = ManualClock(1000.0)
    store = make_store(num_pages=2, clock=clock)
    store.put_blocks(writes(1))
    store.pin([1], lease_s=10.0)
    clock.advance(8.0)
    store.pin([1], lease_s=10.0)
    store.unpin([1])
    clock.advance(8.0)  # past the first lease
    store.maintenance()
    assert store.stats().pinned_pages == 1


def test_a_pin_without_a_lease_stays_until_unpinned():
    clock = ManualClock(1000.0)
    store = make_store(num_pages=2, clock=clock)
    store.put_blocks(writes(1))
    store.pin([1])
    clock.advance(1e6)
    store.maintenance()
    assert store.stats().pinned_pages == 1
    assert store.unpin([1]) == 1


def test_unpin_cannot_end_a_readers_pin():
    store = make_store(num_pages=2)
    store.put_blocks(writes(1))
    reading = store.get_blocks([1])
    next(reading)  # the stream holds its read pin
    with pytest.raises(FailedPrecondition, match="not pinned"):
        store.unpin([1])
    reading.close()
    assert store.stats().pinned_pages == 0


@pytest.mark.parametrize("lease_s", [0.0, -1.0, 24 * 3600.0 + 1])
def test_pin_leases_are_bounded(lease_s):
    store = make_store(num_pages=2)
    store.put_blocks(writes(1))
    with pytest.raises(InvalidArgument, match="lease_s"):
        store.pin([1], lease_s=lease_s)
    assert store.stats().pinned_pages == 0
