"""The server's admission of streams (StreamSlots), the tolerant request
deserializer, and the thread pool ServerSettings sizes from the caps."""
from __future__ import annotations

import pytest

from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument, ResourceExhausted
from speckv.services.common.rpc.interceptor import StreamSlots, Undecodable, peer_host, tolerant
from speckv.services.common.rpc.server import ServerSettings
from speckv.v1 import kvstore_pb2


def test_slots_cap_the_total_and_each_peer_and_come_back_on_release():
    slots = StreamSlots(total=3, per_peer=2)
    slots.acquire("ipv4:10.0.0.1")
    slots.acquire("ipv4:10.0.0.1")
    with pytest.raises(ResourceExhausted, match="per peer"):
        slots.acquire("ipv4:10.0.0.1")
    slots.acquire("ipv4:10.0.0.2")
    with pytest.raises(ResourceExhausted, match="max_streams"):
        slots.acquire("ipv4:10.0.0.3")
    assert slots.in_use == 3
    slots.release("ipv4:10.0.0.1")
    slots.acquire("ipv4:10.0.0.3")  # the freed slot serves any peer
    with pytest.raises(ResourceExhausted):
        slots.acquire("ipv4:10.0.0.1")
    for peer in ("ipv4:10.0.0.1", "ipv4:10.0.0.2", "ipv4:10.0.0.3"):
        slots.release(peer)
    assert slots.in_use == 0


def test_a_release_without_an_acquire_changes_nothing():
    slots = StreamSlots(total=1, per_peer=1)
    slots.release("ipv4:10.0.0.9")
    assert slots.in_use == 0
    slots.acquire("ipv4:10.0.0.1")
    with pytest.raises(ResourceExhausted):
        slots.acquire("ipv4:10.0.0.2")


def test_per_peer_is_clamped_to_the_total_and_caps_must_be_positive():
    assert StreamSlots(total=4, per_peer=64).per_peer == 4
    with pytest.raises(InvalidArgument):
        StreamSlots(total=0, per_peer=1)


def test_a_peer_is_its_host_not_its_port():
    assert peer_host("ipv4:127.0.0.1:51234") == "ipv4:127.0.0.1"
    assert peer_host("ipv6:[::1]:51234") == "ipv6:[::1]"
    assert peer_host("unix:/tmp/sock") == "unix:/tmp/sock"


def test_tolerant_parses_good_bytes_and_stands_in_for_bad_ones():
    parse = tolerant(kvstore_pb2.PutBlockRequest.FromString)
    good = kvstore_pb2.PutBlockRequest(block_hash=7, family="f").SerializeToString()
    assert parse(good).block_hash == 7
    garbled = parse(b"\xff\xff\xff")
    bad_utf8 = parse(b"\x1a\x02\xc3\x28")  # field 3 (family), a string, with invalid UTF-8
    assert isinstance(garbled, Undecodable) and isinstance(bad_utf8, Undecodable)
    assert "UTF-8" in bad_utf8.reason
    assert tolerant(None) is None  # raw-bytes methods keep their bytes


def test_the_pool_has_a_thread_per_stream_plus_the_unary_headroom():
    settings = ServerSettings(workers=8, max_streams=40, max_queued_calls=10)
    settings.validate()
    assert settings.handler_threads == 48
    assert settings.max_concurrent_rpcs == 58


@pytest.mark.parametrize("name", ["max_streams", "max_streams_per_peer", "max_queued_calls"])
def test_stream_and_queue_caps_are_flags_and_must_be_positive(name):
    flag = "--" + name.replace("_", "-")
    assert getattr(parse_config(ServerSettings, [flag, "7"], {}, prog="t"), name) == 7
    assert getattr(parse_config(ServerSettings, [], {f"SPECKV_{name.upper()}": "9"}, prog="t"), name) == 9
    with pytest.raises(InvalidArgument, match=name):
        parse_config(ServerSettings, [flag, "0"], {}, prog="t")
