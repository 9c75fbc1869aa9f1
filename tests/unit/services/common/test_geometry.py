from __future__ import annotations

import numpy as np
import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import PRESETS, KVGeometry, preset
from speckv.services.common.rpc.geometry_proto import geometry_from_proto, geometry_to_proto


@pytest.mark.parametrize("name, per_block", [
    ("llama-3-8b", 2 * 32 * 16 * 8 * 128 * 2),  # 2 MiB, 128 KiB per token
    ("llama-3-70b", 2 * 80 * 16 * 8 * 128 * 2),
    ("qwen2.5-7b", 2 * 28 * 16 * 4 * 128 * 2),
    ("tiny", 2 * 2 * 4 * 2 * 8 * 2),
])
def test_presets_derive_bytes_per_block(name, per_block):
    geometry = preset(name)
    assert geometry.bytes_per_block == per_block
    assert geometry.name == name


def test_llama_3_8b_is_128_kib_per_token():
    assert preset("llama-3-8b").bytes_per_token == 128 * 1024


def test_block_size_override_scales_bytes():
    base = preset("llama-3-8b")
    assert preset("llama-3-8b", 32).bytes_per_block == 2 * base.bytes_per_block
    assert preset("llama-3-8b", 0) == base


def test_bf16_is_stored_as_uint16_bits():
    geometry = preset("llama-3-8b")
    assert geometry.storage_dtype == np.dtype(np.uint16)
    assert geometry.itemsize == 2


@pytest.mark.parametrize("name", list(PRESETS))
def test_proto_round_trip(name):
    geometry = preset(name)
    message = geometry_to_proto(geometry)
    assert message.bytes_per_block == geometry.bytes_per_block
    assert geometry_from_proto(message) == geometry


@pytest.mark.parametrize("kwargs, field", [
    (dict(num_layers=0), "num_layers"), (dict(num_kv_heads=-1), "num_kv_heads"),
    (dict(head_dim=0), "head_dim"), (dict(block_size=0), "block_size"), (dict(dtype="int8"), "dtype"),
])
def test_invalid_geometry_names_the_field(kwargs, field):
    values = dict(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float16", block_size=4) | kwargs
    with pytest.raises(InvalidArgument, match=field):
        KVGeometry(**values)


def test_unknown_preset():
    with pytest.raises(InvalidArgument, match="unknown preset"):
        preset("gpt-5")
    with pytest.raises(InvalidArgument, match="block_size"):
        preset("tiny", -1)
