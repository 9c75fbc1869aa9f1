"""The kvstore's events in vLLM's wire format, read back by the scheduler's
own decoder (scheduler/adapters/vllm_decode.py): every event type, both encodings."""
from __future__ import annotations

import msgpack
import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.events import EventType, KVEvent
from speckv.services.kvstore.vllm_encode import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Encoding,
    encode_event,
    parse_replay_request,
    publish_frames,
    replay_end_frames,
    replay_frames,
    to_vllm_events,
)
from speckv.services.scheduler.adapters.vllm_decode import (
    VllmBatchDecoder,
    replay_request,
    split_frames,
    split_replay_frames,
)
from speckv.services.scheduler.holder_index import HolderEventKind

BLOCK = 4
TOP = (1 << 64) - 1  # the largest uint64: past int64, where a signed encoding would break
ENCODINGS = list(Encoding)


def event(kind: EventType, hashes: tuple[int, ...], **fields) -> KVEvent:
    return KVEvent(7, kind, hashes, 1234.5, "n1", BLOCK, **fields)


def decoded(kv_event: KVEvent, encoding: Encoding):
    batch = VllmBatchDecoder(BLOCK).decode(3, encode_event(kv_event, encoding))
    assert not batch.skipped, batch.details
    return batch


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("kind", [EventType.STORED, EventType.COMMITTED])
@pytest.mark.parametrize("tier", list(Tier))
def test_stored_and_committed_read_back_as_stored(encoding, kind, tier):
    for parent in (None, 99):
        batch = decoded(event(kind, (11, 12, TOP), parent=parent, family="fam", order_id="o1",
                              medium=tier.medium), encoding)
        assert (batch.sequence, batch.ts, batch.data_parallel_rank) == (3, 1234.5, 0)
        [stored] = batch.events
        assert (stored.kind, stored.block_hashes, stored.tier) == (HolderEventKind.STORED, [11, 12, TOP], tier)
        assert stored.has_parent is (parent is not None)  # a chain root teaches the scheduler its family


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("tier", list(Tier))
def test_removed_reads_back_as_removed_in_its_tier(encoding, tier):
    [removed] = decoded(event(EventType.REMOVED, (5, TOP), medium=tier.medium), encoding).events
    assert (removed.kind, removed.block_hashes, removed.tier) == (HolderEventKind.REMOVED, [5, TOP], tier)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_snapshot_clears_then_stores_each_resident_block_alone(encoding):
    snapshot = event(EventType.SNAPSHOT, (1, 2), host_block_hashes=(3, 2))
    events = decoded(snapshot, encoding).events
    assert [(e.kind, e.block_hashes, e.tier, e.has_parent) for e in events] == [
        (HolderEventKind.SNAPSHOT, [], Tier.DEVICE, False),  # AllBlocksCleared: the node's inventory is dropped
        (HolderEventKind.STORED, [1], Tier.DEVICE, False),
        (HolderEventKind.STORED, [2], Tier.DEVICE, False),
        (HolderEventKind.STORED, [3], Tier.HOST, False),
        (HolderEventKind.STORED, [2], Tier.HOST, False),
    ]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_an_empty_snapshot_is_a_clear_alone(encoding):
    events = decoded(event(EventType.SNAPSHOT, ()), encoding).events
    assert [e.kind for e in events] == [HolderEventKind.SNAPSHOT]


def test_the_mapping_names_vllm_structs():
    assert to_vllm_events(event(EventType.COMMITTED, (1, 2), parent=0, medium="CPU")) == \
        [BlockStored((1, 2), 0, BLOCK, "CPU")]
    assert to_vllm_events(event(EventType.REMOVED, (1,))) == [BlockRemoved((1,), "GPU")]
    assert to_vllm_events(event(EventType.SNAPSHOT, (4,))) == \
        [AllBlocksCleared(), BlockStored((4,), None, BLOCK, "GPU")]


def test_tagged_is_vllms_current_shape():
    """A positional batch of "type"-tagged maps, only the fields vLLM always
    writes, hashes as unsigned ints, no token ids."""
    payload = encode_event(event(EventType.STORED, (TOP,), parent=8), Encoding.TAGGED)
    ts, events, rank = msgpack.unpackb(payload)
    assert (ts, rank) == (1234.5, 0)
    assert events == [{"type": "BlockStored", "block_hashes": [TOP], "parent_block_hash": 8, "token_ids": [],
                       "block_size": BLOCK, "lora_id": None, "medium": "GPU", "lora_name": None}]
    removed = encode_event(event(EventType.REMOVED, (1,), medium="CPU"), Encoding.TAGGED)
    assert msgpack.unpackb(removed)[1] == [{"type": "BlockRemoved", "block_hashes": [1], "medium": "CPU"}]
    cleared = encode_event(event(EventType.SNAPSHOT, ()), Encoding.TAGGED)
    assert msgpack.unpackb(cleared)[1] == [{"type": "AllBlocksCleared"}]


def test_array_like_is_the_older_positional_shape():
    payload = encode_event(event(EventType.STORED, (1, 2), parent=None), Encoding.ARRAY_LIKE)
    assert msgpack.unpackb(payload)[1] == [["BlockStored", [1, 2], None, [], BLOCK, None, "GPU", None]]
    removed = encode_event(event(EventType.REMOVED, (1,)), Encoding.ARRAY_LIKE)
    assert msgpack.unpackb(removed)[1] == [["BlockRemoved", [1], "GPU"]]
    assert msgpack.unpackb(encode_event(event(EventType.SNAPSHOT, ()), Encoding.ARRAY_LIKE))[1] == \
        [["AllBlocksCleared"]]


def test_encoding_names_parse_and_a_wrong_one_is_named():
    assert Encoding.parse(" Array_Like ") is Encoding.ARRAY_LIKE and Encoding.parse("tagged") is Encoding.TAGGED
    with pytest.raises(InvalidArgument, match="kv_events_encoding='json'"):
        Encoding.parse("json", "kv_events_encoding")


def test_frames_are_the_ones_the_scheduler_reads():
    assert split_frames(publish_frames(b"kv", 2**40, b"payload")) == (2**40, b"payload")
    # The scheduler's DEALER sends ['', start]; the ROUTER receives the client's identity before it.
    assert parse_replay_request([b"client", *replay_request(17)]) == (b"client", 17)
    assert parse_replay_request([b"client", b"", b"\x01"]) is None
    assert parse_replay_request([b"client", b"x", (1).to_bytes(8, "big")]) is None
    assert parse_replay_request([b"", (1).to_bytes(8, "big")]) is None
    # What the ROUTER sends: its first frame routes, the DEALER receives the rest.
    assert split_replay_frames(replay_frames(b"client", 5, b"p")[1:]) == (5, b"p")
    assert split_replay_frames(replay_end_frames(b"client")[1:]) is None
