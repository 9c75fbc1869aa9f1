"""A kvstore's KVEvent as the holder index reads it (event_sync.to_index_event)."""
import pytest

from speckv.services.common.tiers import Tier
from speckv.services.scheduler.adapters.event_sync import to_index_event
from speckv.services.scheduler.holder_index import HolderEventKind
from speckv.v1 import kvstore_pb2


@pytest.mark.parametrize("medium, tier", [("", Tier.DEVICE), ("GPU", Tier.DEVICE), ("CPU", Tier.HOST),
                                          ("STORAGE", Tier.DISK), ("cpu", Tier.HOST), (" disk ", Tier.DISK),
                                          ("device", Tier.DEVICE)])
def test_every_spelling_of_a_medium_names_its_tier(medium, tier):
    event = to_index_event(kvstore_pb2.KVEvent(sequence=3, type=kvstore_pb2.KV_EVENT_TYPE_STORED,
                                               block_hashes=[5, 6], family="f", medium=medium))
    assert event is not None
    assert (event.kind, event.block_hashes, event.tier, event.sequence, event.family) == \
        (HolderEventKind.STORED, [5, 6], tier, 3, "f")


def test_an_unknown_medium_or_kind_is_skipped():
    assert to_index_event(kvstore_pb2.KVEvent(type=kvstore_pb2.KV_EVENT_TYPE_STORED, medium="TAPE")) is None
    assert to_index_event(kvstore_pb2.KVEvent(type=0, block_hashes=[1])) is None


def test_only_a_snapshot_carries_the_lower_tiers_apart():
    snapshot = to_index_event(kvstore_pb2.KVEvent(type=kvstore_pb2.KV_EVENT_TYPE_SNAPSHOT, block_hashes=[1],
                                                  host_block_hashes=[2], disk_block_hashes=[3]))
    assert snapshot is not None and (snapshot.host_hashes, snapshot.disk_hashes) == ([2], [3])
    empty = to_index_event(kvstore_pb2.KVEvent(type=kvstore_pb2.KV_EVENT_TYPE_SNAPSHOT, block_hashes=[1]))
    assert empty is not None and (empty.host_hashes, empty.disk_hashes) == (None, None)
    removed = to_index_event(kvstore_pb2.KVEvent(type=kvstore_pb2.KV_EVENT_TYPE_REMOVED, block_hashes=[1],
                                                 host_block_hashes=[2]))
    assert removed is not None and removed.host_hashes is None and removed.has_parent is False
