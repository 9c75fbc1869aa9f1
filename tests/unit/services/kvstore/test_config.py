from __future__ import annotations

import pytest

from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument
from speckv.services.kvstore.config import KVStoreConfig


def parse(argv=(), environ=None):
    return parse_config(KVStoreConfig, list(argv), environ or {}, prog="speckv kvstore")


def test_defaults():
    config = parse()
    assert (config.node_id, config.geometry, config.device_pages, config.scheduler) == ("node-0", "tiny", 4096, "")
    assert config.kv_geometry().bytes_per_block == 512 and config.chunk_bytes == 1 << 20


def test_flags_beat_environment():
    config = parse(["--geometry", "llama-3-8b", "--block-size", "32"],
                   {"SPECKV_GEOMETRY": "tiny", "SPECKV_NODE_ID": "n7", "SPECKV_CHUNK_KIB": "256"})
    assert config.node_id == "n7" and config.chunk_bytes == 256 * 1024
    assert config.kv_geometry().block_size == 32 and config.kv_geometry().bytes_per_block == 4 << 20


@pytest.mark.parametrize("argv, field", [
    (["--node-id", " "], "node_id"),
    (["--geometry", "gpt-9"], "geometry"),
    (["--block-size", "-1"], "block_size"),
    (["--device-pages", "0"], "device_pages"),
    (["--host-pages", "-1"], "host_pages"),
    (["--chunk-kib", "128"], "chunk_kib"),
    (["--chunk-kib", "8192"], "chunk_kib"),
    (["--nixl-batch-kib", "128"], "nixl_batch_kib"),
    (["--nixl-batch-kib", "131072"], "nixl_batch_kib"),
    (["--event-retention", "0"], "event_retention"),
    (["--heartbeat-interval-s", "0"], "heartbeat_interval_s"),
    (["--reservation-lease-s", "-1"], "reservation_lease_s"),
    (["--max-message-mb", "4", "--geometry", "llama-3-70b", "--block-size", "16"], "max_message_mb"),
    (["--port", "70000"], "port"),
])
def test_invalid_values_name_the_field(argv, field):
    with pytest.raises(InvalidArgument, match=field):
        parse(argv)


def test_geometry_overrides_make_a_custom_shape():
    config = parse_config(KVStoreConfig, ["--geometry", "tiny", "--num-layers", "3", "--head-dim", "64",
                                          "--dtype", "float32", "--block-size", "16"], {}, prog="t")
    g = config.kv_geometry()
    assert (g.num_layers, g.num_kv_heads, g.head_dim, g.dtype, g.block_size, g.name) == \
        (3, 2, 64, "float32", 16, "custom")
    assert g.bytes_per_block == 2 * 3 * 2 * 64 * 4 * 16


@pytest.mark.parametrize("argv, fragment", [(["--num-layers", "-1"], "num_layers=-1"),
                                            (["--dtype", "int8"], "dtype='int8'")])
def test_bad_geometry_overrides_are_named(argv, fragment):
    with pytest.raises(InvalidArgument, match=fragment):
        parse_config(KVStoreConfig, argv, {}, prog="t")


def test_scheduler_takes_replicas_static_and_through_dns():
    config = parse(["--scheduler", "a:50052,dns:speckv-scheduler-replicas:50052"])
    assert config.scheduler == "a:50052,dns:speckv-scheduler-replicas:50052"
    for bad, message in (("dns:svc", "expected dns:NAME:PORT"), ("sched", "scheduler: 'sched'")):
        with pytest.raises(InvalidArgument, match=message):
            parse(["--scheduler", bad])
