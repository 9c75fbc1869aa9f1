"""vLLM KV event batches -> index events: both msgspec encodings (positional
arrays and "type"-tagged maps), missing optional fields, int and bytes
hashes, garbage; the sequence rules; the --kv-events spec."""
import hashlib

import msgpack
import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.adapters.vllm_decode import (
    BadInput,
    CatchUp,
    SequenceTracker,
    Skip,
    VllmBatchDecoder,
    contiguous_run,
    normalise_hash,
    replay_request,
    split_frames,
    split_replay_frames,
)
from speckv.services.scheduler.adapters.vllm_subscriber import DEFAULT_PAGES, VllmNodeSpec, parse_kv_events
from speckv.services.scheduler.holder_index import HolderEventKind, HolderIndex

DECODER = VllmBatchDecoder(block_size=16)
TOKENS = list(range(32))


def sha(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


def stored_array(hashes, parent=None, block_size=16, *, medium="GPU", trailing=True):
    event = ["BlockStored", hashes, parent, TOKENS[:16 * len(hashes)], block_size, None]
    return event + [medium] if trailing else event  # releases before tiers end at lora_id


def stored_map(hashes, parent=None, block_size=16, **extra):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": TOKENS[:16 * len(hashes)], "block_size": block_size, "lora_id": None,
            "medium": "GPU", "lora_name": None, **extra}


def array_batch(*events, ts=1.5):
    return msgpack.packb([ts, list(events)], use_bin_type=True)


def map_batch(*events, ts=1.5, rank=None):
    batch = {"ts": ts, "events": list(events)}
    if rank is not None:
        batch["data_parallel_rank"] = rank
    return msgpack.packb(batch, use_bin_type=True)


# --- hashes -------------------------------------------------------------------

def test_hashes_normalise_to_uint64():
    assert normalise_hash(7) == 7
    assert normalise_hash(-1) == (1 << 64) - 1  # older releases: signed 64-bit ints
    assert normalise_hash(1 << 70 | 5) == 5
    digest = sha(1)
    # the low 64 bits of the big-endian value: what vLLM itself publishes with int hashes on
    assert normalise_hash(digest) == int.from_bytes(digest, "big") & ((1 << 64) - 1)
    assert normalise_hash(b"\x01\x02") == 0x0102
    for bad in (True, b"", "abc", 1.5, None, [1]):
        with pytest.raises(TypeError):
            normalise_hash(bad)


# --- both encodings -----------------------------------------------------------

@pytest.mark.parametrize("encode", [array_batch, map_batch])
def test_stored_removed_cleared_in_either_encoding(encode):
    if encode is array_batch:
        events = (stored_array([11, 12]), stored_array([13], parent=12, medium="CPU"),
                  ["BlockRemoved", [11], "GPU"], ["AllBlocksCleared"])
    else:
        events = (stored_map([11, 12]), stored_map([13], parent=12, medium="CPU"),
                  {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"}, {"type": "AllBlocksCleared"})
    batch = DECODER.decode(4, encode(*events))
    assert batch.sequence == 4 and batch.ts == 1.5 and not batch.skipped
    first, second, removed, cleared = batch.events
    assert (first.kind, first.block_hashes, first.has_parent, first.tier) == \
        (HolderEventKind.STORED, [11, 12], False, Tier.DEVICE)
    assert (second.block_hashes, second.has_parent, second.tier) == ([13], True, Tier.HOST)
    assert (removed.kind, removed.block_hashes, removed.tier) == (HolderEventKind.REMOVED, [11], Tier.DEVICE)
    assert (cleared.kind, cleared.block_hashes) == (HolderEventKind.SNAPSHOT, [])
    assert {e.sequence for e in batch.events} == {4}


def test_batch_fields_in_either_encoding():
    assert DECODER.decode(0, map_batch(stored_map([1]), rank=3)).data_parallel_rank == 3
    assert DECODER.decode(0, msgpack.packb([2.0, [], 1])).data_parallel_rank == 1
    assert DECODER.decode(0, msgpack.packb([2, []])).ts == 2.0  # omit_defaults drops a None rank


def test_missing_optional_fields_take_their_defaults():
    old_stored = stored_array([21, 22], trailing=False)  # no medium: a release before tiers
    old_removed = ["BlockRemoved", [21]]
    sparse_map = {"type": "BlockStored", "block_hashes": [23], "block_size": 16}
    batch = DECODER.decode(0, array_batch(old_stored, old_removed))
    assert [(e.kind, e.tier) for e in batch.events] == [(HolderEventKind.STORED, Tier.DEVICE),
                                                         (HolderEventKind.REMOVED, Tier.DEVICE)]
    (event,) = DECODER.decode(0, map_batch(sparse_map)).events
    assert (event.block_hashes, event.has_parent) == ([23], False)


def test_newer_trailing_fields_are_ignored():
    newer = stored_array([31], medium="GPU") + ["lora-x", [None], 0, "full_attention", None, "future"]
    batch = DECODER.decode(0, array_batch(newer, stored_map([32], group_idx=0, extra_keys=[None])))
    assert [e.block_hashes for e in batch.events] == [[31], [32]] and not batch.skipped


def test_int_and_bytes_hashes_land_on_the_same_ids():
    hashes = [sha(1), sha(2)]
    as_ints = [int.from_bytes(h, "big") & ((1 << 64) - 1) for h in hashes]
    from_bytes = DECODER.decode(0, map_batch(stored_map(hashes))).events[0]
    from_ints = DECODER.decode(1, array_batch(stored_array(as_ints))).events[0]
    assert from_bytes.block_hashes == from_ints.block_hashes == as_ints
    negative = DECODER.decode(2, array_batch(stored_array([-5], parent=-6))).events[0]
    assert negative.block_hashes == [(1 << 64) - 5] and negative.has_parent


def test_events_feed_the_index_family_by_first_hash():
    idx = HolderIndex()
    for event in DECODER.decode(0, array_batch(stored_array([41, 42]), stored_array([43], parent=42))).events:
        idx.apply("a", event)
    assert idx.longest_prefix("a", [41, 42, 43, 44]) == 3
    assert idx.family_nodes("41") == {"a"}  # Route's default family: the first hash in decimal
    for event in DECODER.decode(1, array_batch(["AllBlocksCleared"])).events:
        idx.apply("a", event)
    assert idx.num_blocks("a") == 0


# --- refused and bad input ----------------------------------------------------

def test_other_block_size_is_refused_not_converted():
    batch = DECODER.decode(0, array_batch(stored_array([51], block_size=32), stored_array([52])))
    assert [e.block_hashes for e in batch.events] == [[52]]
    assert batch.skipped == {Skip.BLOCK_SIZE: 1} and "32-token" in batch.details[Skip.BLOCK_SIZE]


@pytest.mark.parametrize("payload", [b"", b"\xc1", b"not msgpack at all \xff\xfe", msgpack.packb(42),
                                     msgpack.packb("text"), msgpack.packb([1.0]), msgpack.packb(["x", []]),
                                     msgpack.packb({"ts": 1.0}), msgpack.packb([1.0, "events"]),
                                     msgpack.packb([True, []]), msgpack.packb([1.0, [], "rank"]),
                                     msgpack.packb([1.0, []]) + b"trailing"])
def test_garbage_batches_are_refused_whole(payload):
    with pytest.raises(BadInput) as info:
        DECODER.decode(0, payload)
    assert info.value.reason is Skip.GARBAGE


def test_bad_events_are_skipped_and_counted_the_rest_stands():
    batch = DECODER.decode(0, array_batch(
        ["BlockMoved", [1]],  # unknown tag
        {"type": "Teleported"},  # unknown tag, map form
        7, [], [3, [1]], {"block_hashes": [1]},  # not tagged structs
        ["BlockStored", "not-a-list", None, [], 16, None],
        ["BlockStored", [1.5], None, [], 16, None],  # a float hash
        ["BlockStored", [True], None, [], 16, None],  # a bool hash
        ["BlockStored", [61], None, [], "16", None],  # block_size of the wrong type
        ["BlockStored", [61], "parent?", [], 16, None],  # a parent of the wrong type
        ["BlockStored", [61], None, [], 16, None, "NVME"],  # unknown medium
        ["BlockRemoved", [61], 5],  # medium of the wrong type
        ["BlockRemoved", [62], "GPU", 1],  # KV cache group 1 (hybrid model)
        stored_array([63]),
    ))
    assert [e.block_hashes for e in batch.events] == [[63]]
    assert batch.skipped == {Skip.UNKNOWN_TAG: 2, Skip.BAD_EVENT: 10, Skip.UNKNOWN_MEDIUM: 1, Skip.KV_GROUP: 1}


def test_empty_hash_lists_are_no_events():
    assert DECODER.decode(0, array_batch(stored_array([]), ["BlockRemoved", [], None])).events == []


# --- frames -------------------------------------------------------------------

def test_frames_of_a_published_batch():
    assert split_frames([b"kv", (5).to_bytes(8, "big"), b"payload"]) == (5, b"payload")
    for bad in ([b"kv", b"\x00" * 8], [b"kv", b"\x05", b"p"], [b"a", b"b", b"c", b"d"]):
        with pytest.raises(BadInput) as info:
            split_frames(bad)
        assert info.value.reason is Skip.BAD_FRAMES


def test_replay_frames_and_request():
    assert replay_request(3) == [b"", b"\x00" * 7 + b"\x03"]
    assert split_replay_frames([b"", (9).to_bytes(8, "big"), b"p"]) == (9, b"p")
    assert split_replay_frames([b"", (-1).to_bytes(8, "big", signed=True), b""]) is None
    assert split_replay_frames([b"", (4).to_bytes(8, "big"), b""]) is None  # an empty payload also ends it
    with pytest.raises(BadInput):
        split_replay_frames([(9).to_bytes(8, "big"), b"p"])  # a REQ-style reply without the delimiter


def test_replay_frames_of_vllm_0_32_carry_the_topic():
    """vllm/distributed/kv_events.py 0.32, _service_replay: (client, '', topic,
    seq, payload) per batch, (client, '', '', END_SEQ, '') at the end; the
    DEALER receives all but the client."""
    assert split_replay_frames([b"", b"kv-events", (9).to_bytes(8, "big"), b"p"]) == (9, b"p")
    assert split_replay_frames([b"", b"", (-1).to_bytes(8, "big", signed=True), b""]) is None
    with pytest.raises(BadInput):
        split_replay_frames([b"", b"kv-events", b"x", (9).to_bytes(8, "big"), b"p"])


# --- sequences ----------------------------------------------------------------

def test_sequence_rules():
    t = SequenceTracker()
    assert t.plan(0) == CatchUp(True, None, "fresh subscription")  # nothing before 0: no replay
    t.applied(0)
    assert t.plan(1) == CatchUp(False, None, "")
    t.applied(1)
    plan = t.plan(5)
    assert (plan.reset, plan.replay_from) == (False, 2) and "2..4" in plan.why
    t.applied(5)
    plan = t.plan(3)  # went back: a new publisher process
    assert (plan.reset, plan.replay_from) == (True, 0) and "restarted" in plan.why
    assert t.plan(0).replay_from is None
    t.lost_connection()
    assert t.plan(9) == CatchUp(True, 0, "fresh subscription")


def test_contiguous_run_of_a_replay():
    replayed = [(s, b"%d" % s) for s in (1, 2, 3, 4, 5, 6)]
    assert contiguous_run(replayed, 2, 5) == ([(2, b"2"), (3, b"3"), (4, b"4")], True)
    assert contiguous_run(replayed, 0, 5) == ([(1, b"1"), (2, b"2"), (3, b"3"), (4, b"4")], False)  # 0 gone
    assert contiguous_run([(1, b"1"), (3, b"3")], 1, 4) == ([(3, b"3")], False)  # a hole: only the tail
    assert contiguous_run([], 0, 3) == ([], False)
    assert contiguous_run([], 3, 3) == ([], True)


# --- the --kv-events spec -----------------------------------------------------

def test_kv_events_spec():
    specs = parse_kv_events(" a=tcp://10.0.0.5:5557, replay=tcp://10.0.0.5:5558 ,address=10.0.0.5:8000;"
                            "b=tcp://h:1,pages=10,topic=kv;; c=ipc:///tmp/c.sock,address=c:80 ")
    assert specs == [VllmNodeSpec("a", "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558", "10.0.0.5:8000"),
                     VllmNodeSpec("b", "tcp://h:1", pages=10, topic="kv"),
                     VllmNodeSpec("c", "ipc:///tmp/c.sock", address="c:80")]
    assert specs[1].route_address == "h:1" and specs[0].pages == DEFAULT_PAGES
    assert parse_kv_events("") == []


def test_kv_events_spec_of_an_engine_beside_its_kvstore():
    (a, b) = parse_kv_events("a=tcp://h:1,kvstore=1;b=ipc:///tmp/b.sock,kvstore=yes")
    assert a.kvstore and b.kvstore  # no address needed: the kvstore registers the node
    assert not parse_kv_events("a=tcp://h:1,kvstore=0")[0].kvstore


def test_kv_events_spec_with_the_engines_health_url():
    (a, b) = parse_kv_events("a=tcp://h:1,kvstore=1,health=http://h:8000/health;b=tcp://h:2,address=h:3")
    assert (a.health, b.health) == ("http://h:8000/health", "")  # without health=: not probed


@pytest.mark.parametrize("text", ["a", "=tcp://h:1", "a=h:1", "a=tcp://h", "a=tcp://h:1,replay=h:2",
                                  "a=tcp://h:1,color=red", "a=tcp://h:1,pages=0", "a=tcp://h:1,pages=x",
                                  "a=ipc:///tmp/a", "a=tcp://h:1;a=tcp://h:2", "a=tcp://h:1,pages=1,pages=2",
                                  "a=tcp://h:1,kvstore=maybe", "a=tcp://h:1,kvstore=1,address=h:2",
                                  "a=tcp://h:1,kvstore=1,pages=5", "a=tcp://h:1,kvstore=1,health=h:8000",
                                  "a=tcp://h:1,kvstore=1,health=", "a=tcp://h:1,kvstore=1,health=http://h:x/health",
                                  "a=tcp://h:1,kvstore=1,health=tcp://h:1/health"])
def test_kv_events_spec_rejects(text):
    with pytest.raises(InvalidArgument):
        parse_kv_events(text)


# --- the connector's ids ------------------------------------------------------

def test_with_the_engines_digest_its_blocks_take_the_connectors_ids():
    """An engine's events, int or bytes hashes alike, map onto the ids the
    connector names the same blocks by (identity.block_id of the full hash)."""
    from speckv.services.engine.vllm_connector.identity import KVLayout, block_id

    layout = KVLayout("m", "float32", 16, 2, 2, 8, 0, "cpu:H,2,N,C", "sha256")
    decoder = VllmBatchDecoder(block_size=16, digest=layout.digest())
    full = [sha(1), sha(2)]
    as_ints = [int.from_bytes(h, "big") & ((1 << 64) - 1) for h in full]  # vLLM's default event ids
    for hashes in (full, as_ints):
        events = decoder.decode(0, array_batch(stored_array(hashes))).events
        assert events[0].block_hashes == [block_id(layout.digest(), h) for h in full]
    other = VllmBatchDecoder(16, KVLayout("other", "float32", 16, 2, 2, 8, 0, "cpu:H,2,N,C", "sha256").digest())
    assert not set(other.decode(0, array_batch(stored_array(full))).events[0].block_hashes) & set(
        block_id(layout.digest(), h) for h in full)  # another layout never shares an id


def test_a_digest_in_the_spec_is_32_bytes_of_hex():
    digest = "ab" * 32
    (spec,) = parse_kv_events(f"n1=tcp://127.0.0.1:5557,address=127.0.0.1:8000,digest={digest}")
    assert spec.digest == bytes.fromhex(digest)
    for bad in ("ab" * 31, "zz" * 32, ""):
        with pytest.raises(InvalidArgument, match="digest"):
            parse_kv_events(f"n1=tcp://127.0.0.1:5557,address=127.0.0.1:8000,digest={bad}")
