"""KVGeometry to and from its protobuf message: for servicers and gRPC
clients only, so the cores that use KVGeometry never import protobuf."""
from __future__ import annotations

from speckv.services.common.geometry import KVGeometry
from speckv.v1 import common_pb2


def geometry_to_proto(geometry: KVGeometry) -> common_pb2.KVGeometry:
    return common_pb2.KVGeometry(
        num_layers=geometry.num_layers, num_kv_heads=geometry.num_kv_heads, head_dim=geometry.head_dim,
        dtype=geometry.dtype, block_size=geometry.block_size, bytes_per_block=geometry.bytes_per_block,
        name=geometry.name)


def geometry_from_proto(message: common_pb2.KVGeometry) -> KVGeometry:
    """bytes_per_block in the message is ignored (it is derived)."""
    return KVGeometry(
        num_layers=message.num_layers, num_kv_heads=message.num_kv_heads,
        head_dim=message.head_dim, dtype=message.dtype, block_size=message.block_size,
        name=message.name)
