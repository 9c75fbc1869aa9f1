"""The durable control state's records as flat rows: one tuple per order or
node, in the column order of the SQLite state store's tables
(adapters/state_store.py), which the etcd state store (leadership/state_store.py)
keeps too, so both read and write the same fields by the same code.

- A transport row is one (source, target, transport)'s committed copies:
  (source, target, transport, orders, bytes).
- An order row ends with `finished`: the number of its place among terminal
  orders in the order they finished (None while active).
- Block hashes are uint64, kept as one little-endian 8-byte word each
  (`hashes_blob`): SQLite's INTEGER is signed, and 8 bytes a hash is the
  smallest exact form for either store.
- Reading a row back raises ValueError, TypeError or struct.error (or a
  SpeckvError from an enum's parse) when it is damaged; each store turns
  that into its own FailedPrecondition naming where the row lives.
"""
from __future__ import annotations

import struct
from typing import Any, Sequence

from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import Family, NodeId, OrderId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.orders import ActionKind, Order, OrderSpec, OrderState
from speckv.services.scheduler.ports import SavedNode
from speckv.services.scheduler.replication.transports import Carried, check_transport

ORDER_FIELDS = 19
NODE_FIELDS = 11
CARRIED_FIELDS = 5


def hashes_blob(hashes: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(hashes)}Q", *hashes)


def hashes_from_blob(blob: bytes) -> list[int]:
    if len(blob) % 8:
        raise ValueError(f"block_hashes of {len(blob)} bytes: not whole 8-byte words")
    return list(struct.unpack(f"<{len(blob) // 8}Q", blob))


def order_row(order: Order, finished: int | None) -> tuple[object, ...]:
    """order as a row; finished: its number among terminal orders (None: active)."""
    s = order.spec
    return (order.order_id, s.family, hashes_blob(s.block_hashes), s.source, s.target, s.target_address,
            s.lease_ms, s.priority, s.expected_benefit_ms, s.policy, s.tier.value if s.tier else None,
            s.action.value, order.state.value, order.created_at, order.last_progress, order.message,
            order.bytes_sent, order.blocks_sent, finished)


def order_from_row(row: Sequence[Any]) -> Order:
    (order_id, family, blob, source, target, target_address, lease_ms, priority, benefit, policy, tier, action,
     state, created_at, last_progress, message, bytes_sent, blocks_sent, _finished) = row
    spec = OrderSpec(Family(family), hashes_from_blob(blob), NodeId(source), NodeId(target), int(lease_ms),
                     int(priority), float(benefit), policy, target_address, order_id,
                     Tier(tier) if tier is not None else None, ActionKind(action))
    return Order(OrderId(order_id), spec, OrderState(state), float(created_at), float(last_progress), message,
                 int(bytes_sent), int(blocks_sent))


def row_finished(row: Sequence[Any]) -> int | None:
    """The `finished` number an order row carries (None: active)."""
    finished = row[ORDER_FIELDS - 1]
    return None if finished is None else int(finished)


def node_row(node: SavedNode) -> tuple[object, ...]:
    g, sizes = node.geometry, node.sizes
    return (node.node_id, node.address, sizes.device_pages, sizes.host_pages, g.num_layers, g.num_kv_heads,
            g.head_dim, g.dtype, g.block_size, g.name, sizes.retain_max_blocks)


def node_from_row(row: Sequence[Any]) -> SavedNode:
    node_id, address, capacity, host, layers, heads, head_dim, dtype, block_size, name, retain_max = row
    sizes = NodeSizes(int(capacity), int(host), None if retain_max is None else int(retain_max))
    return SavedNode(NodeId(node_id), address, sizes,
                     KVGeometry(int(layers), int(heads), int(head_dim), dtype, int(block_size), name))


def carried_row(carried: Carried) -> tuple[object, ...]:
    return (carried.source, carried.target, carried.transport, carried.orders, carried.bytes)


def carried_from_row(row: Sequence[Any]) -> Carried:
    source, target, transport, orders, nbytes = row
    if not isinstance(source, str) or not isinstance(target, str) or not isinstance(transport, str):
        raise TypeError(f"transport row {list(row)!r}: source, target and transport must be text")
    if int(orders) <= 0 or int(nbytes) < 0:
        raise ValueError(f"transport row {list(row)!r}: orders must be > 0 and bytes >= 0")
    return Carried(source, target, check_transport(transport), int(orders), int(nbytes))
