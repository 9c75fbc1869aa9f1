import socket

import numpy as np

from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.kvstore_client import KVStoreClient
from tests.support.kvstore_service import TINY, kvstore


def free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_a_kvstore_that_is_down_answers_nothing_and_counts():
    counters = Counters()
    client = KVStoreClient(free_address(), counters, lookup_timeout_s=0.5, transfer_timeout_s=0.5)
    assert client.prefix_blocks([1, 2]) == 0
    assert client.get([1]) is None
    client.put([1], [None], "1", [b"x"])
    client.close()
    snapshot = counters.snapshot()
    assert snapshot["lookup_failures"] == 1 and snapshot["load_failures"] == 1 and snapshot["save_failures"] == 1


def test_a_peer_that_failed_a_lookup_is_not_asked_again_for_a_while():
    counters = Counters()
    peer = KVStoreClient(free_address(), counters, lookup_timeout_s=0.5, peer=True)
    assert peer.prefix_blocks([1, 2]) == 0 and peer.prefix_blocks([1, 2]) == 0
    peer.close()
    snapshot = counters.snapshot()
    # one ask, then quiet: the second request costs nothing; counted apart from the node's own kvstore
    assert (snapshot["peer_lookups"], snapshot["peer_lookup_failures"], snapshot["lookups"]) == (1, 1, 0)


def test_put_lookup_get_round_trip_and_a_missing_block_is_nothing():
    data = [np.random.default_rng(i).integers(0, 256, TINY.bytes_per_block, dtype=np.uint8).tobytes()
            for i in range(3)]
    with kvstore() as (server, _):
        counters = Counters()
        client = KVStoreClient(server.address, counters)
        client.put([7, 8, 9], [None, 7, 8], "7", data)
        assert counters.blocks_saved == 3
        assert client.prefix_blocks([7, 8, 9, 10]) == 3
        assert client.get([7, 8, 9]) == data
        assert client.get([7, 10]) is None and counters.load_failures == 1
        client.close()


def test_a_kvstore_of_another_geometry_turns_the_connector_off():
    from speckv.services.engine.vllm_connector.connector import _geometry_mismatch
    from tests.support.connector_fakes import LAYOUT

    with kvstore() as (server, _):  # the tiny preset: 2 layers, 2 KV heads of 8, float16, blocks of 4
        client = KVStoreClient(server.address, Counters())
        assert "holds" in _geometry_mismatch(client, LAYOUT)
        client.close()
    with kvstore(block_size=32, num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32") as (server, _):
        client = KVStoreClient(server.address, Counters())
        assert _geometry_mismatch(client, LAYOUT) == ""
        client.close()
    down = KVStoreClient(free_address(), Counters())
    assert _geometry_mismatch(down, LAYOUT) == ""  # cannot ask now: each later call fails open on its own
    down.close()
