"""The vLLM KV event publisher's parts: its replay buffer, its settings (the
kvstore's kv_events_* fields) and the publisher itself on a real store and
real ZMQ sockets (ipc://, so no port is raced for)."""
from __future__ import annotations

import pytest
import zmq

from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument, Unavailable
from speckv.services.common.tiers import Tier
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.kvstore.vllm_encode import Encoding
from speckv.services.kvstore.vllm_publisher import (
    PublisherSettings,
    ReplayBuffer,
    VllmEventPublisher,
    check_endpoint,
)
from speckv.services.scheduler.adapters.vllm_decode import VllmBatchDecoder
from speckv.services.scheduler.holder_index import HolderEventKind
from tests.support.kvstore_service import TINY, make_store, writes
from tests.support.vllm_replay import replay
from tests.support.waiting import wait_until

# --- the replay buffer ---------------------------------------------------------

def test_the_replay_buffer_keeps_the_last_batches_in_order():
    buffer = ReplayBuffer(3)
    for sequence in range(5):
        buffer.append(sequence, b"%d" % sequence)
    assert len(buffer) == 3
    assert buffer.since(0) == [(2, b"2"), (3, b"3"), (4, b"4")]  # 0 and 1 are gone: not replayed
    assert buffer.since(3) == [(3, b"3"), (4, b"4")]
    assert buffer.since(9) == []
    assert ReplayBuffer(1).since(0) == []


def test_the_replay_buffer_refuses_a_gap_and_a_size_of_zero():
    buffer = ReplayBuffer(3)
    buffer.append(7, b"")
    with pytest.raises(ValueError, match="does not follow"):
        buffer.append(9, b"")
    with pytest.raises(ValueError):
        ReplayBuffer(0)


# --- settings ------------------------------------------------------------------

@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:5557", "tcp://*:5557", "tcp://[::1]:5557", "ipc:///tmp/x"])
def test_bindable_endpoints_pass(endpoint):
    check_endpoint("kv_events_publish", endpoint)


@pytest.mark.parametrize("endpoint", ["127.0.0.1:5557", "tcp://127.0.0.1", "tcp://:5557", "tcp://h:0",
                                      "tcp://h:99999", "udp://h:1", "ipc://"])
def test_other_endpoints_are_refused_by_name(endpoint):
    with pytest.raises(InvalidArgument, match="kv_events_publish="):
        check_endpoint("kv_events_publish", endpoint)


def parse(argv=(), environ=None) -> KVStoreConfig:
    return parse_config(KVStoreConfig, list(argv), environ or {}, prog="speckv kvstore")


def test_publishing_is_off_by_default_and_set_by_flags_or_environment():
    assert parse().kv_events_settings() is None
    config = parse(["--kv-events-publish", "tcp://*:5557", "--kv-events-replay", "tcp://*:5558",
                    "--kv-events-encoding", "array_like"],
                   {"SPECKV_KV_EVENTS_TOPIC": "kv", "SPECKV_KV_EVENTS_REPLAY_BATCHES": "50",
                    "SPECKV_KV_EVENTS_ENCODING": "tagged"})
    assert config.kv_events_settings() == PublisherSettings("tcp://*:5557", "tcp://*:5558", "kv",
                                                            Encoding.ARRAY_LIKE, 50)
    assert parse(["--kv-events-publish", "ipc:///tmp/e"]).kv_events_settings() == \
        PublisherSettings("ipc:///tmp/e", "", "", Encoding.TAGGED, 10_000)


@pytest.mark.parametrize("argv, field", [
    (["--kv-events-publish", "localhost:5557"], "kv_events_publish"),
    (["--kv-events-replay", "tcp://*:5558"], "kv_events_replay"),  # a replay socket without a PUB socket
    (["--kv-events-publish", "tcp://*:5557", "--kv-events-replay", "tcp://*"], "kv_events_replay"),
    (["--kv-events-publish", "tcp://*:5557", "--kv-events-replay", "tcp://*:5557"], "kv_events_replay"),
    (["--kv-events-encoding", "json"], "kv_events_encoding"),
    (["--kv-events-replay-batches", "0"], "kv_events_replay_batches"),
])
def test_bad_settings_name_the_field(argv, field):
    with pytest.raises(InvalidArgument, match=field):
        parse(argv)


# --- the publisher on a real store ---------------------------------------------

@pytest.fixture
def endpoints(tmp_path):
    return f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"


def test_blocks_resident_before_it_starts_are_published_as_a_reset(endpoints):
    """The publisher reads the log from 0, so a store that already holds
    blocks hands it a snapshot: AllBlocksCleared, then each block."""
    store = make_store(num_pages=8, host_pages=4)
    store.put_blocks(writes(1, 2, 3))
    publisher = VllmEventPublisher(store, PublisherSettings(*endpoints), "n1").start()
    try:
        assert wait_until(lambda: publisher.stats().published == 1)
        store.put_blocks(writes(4, 5))
        assert wait_until(lambda: publisher.stats().published == 2)
        [(s0, first), (s1, second)] = replay(endpoints[1], 0)
        decoder = VllmBatchDecoder(TINY.block_size)
        assert [(e.kind, e.block_hashes, e.tier) for e in decoder.decode(s0, first).events] == [
            (HolderEventKind.SNAPSHOT, [], Tier.DEVICE),
            *((HolderEventKind.STORED, [h], Tier.DEVICE) for h in (1, 2, 3))]
        [stored] = decoder.decode(s1, second).events
        assert (s0, s1, stored.kind, stored.block_hashes, stored.has_parent) == (0, 1, HolderEventKind.STORED,
                                                                                 [4, 5], False)
        assert publisher.stats().snapshots == 1 and publisher.stats().replays == 1
    finally:
        store.close()
        publisher.stop()


def test_the_replay_socket_answers_from_what_the_buffer_still_holds(endpoints):
    store = make_store(num_pages=8)
    settings = PublisherSettings(*endpoints, encoding=Encoding.ARRAY_LIKE, replay_batches=2)
    publisher = VllmEventPublisher(store, settings, "n1").start()
    assert publisher.endpoints == endpoints
    try:
        for h in (10, 20, 30, 40):
            store.put_blocks(writes(h))
        assert wait_until(lambda: publisher.stats().published == 4)
        assert [s for s, _ in replay(endpoints[1], 0)] == [2, 3]  # 0 and 1 fell out of the buffer
        assert [s for s, _ in replay(endpoints[1], 3)] == [3]
        assert replay(endpoints[1], 4) == []  # nothing missed: the end marker alone
        events = VllmBatchDecoder(TINY.block_size).decode(*replay(endpoints[1], 3)[0]).events
        assert [(e.kind, e.block_hashes) for e in events] == [(HolderEventKind.STORED, [40])]
    finally:
        store.close()
        publisher.stop()


def test_a_taken_endpoint_fails_at_construction_and_stop_needs_no_start(endpoints):
    store = make_store()
    context = zmq.Context()
    squatter = context.socket(zmq.PUB)  # a TCP port someone else holds (ipc:// would take the path over)
    taken = f"tcp://127.0.0.1:{squatter.bind_to_random_port('tcp://127.0.0.1')}"
    try:
        with pytest.raises(Unavailable, match="kv_events_publish="):
            VllmEventPublisher(store, PublisherSettings(taken), "n1")
        with pytest.raises(Unavailable, match="kv_events_replay="):  # the PUB socket it bound first is closed
            VllmEventPublisher(store, PublisherSettings(endpoints[0], taken), "n1")
        VllmEventPublisher(store, PublisherSettings(*endpoints), "n1").stop()  # never started: closes, ends
    finally:
        squatter.close(linger=0)
        context.term()
