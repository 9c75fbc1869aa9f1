"""ReplicationTarget that calls another KVStoreCore in the same process: the
transport of the discrete-event simulator and of core tests. It runs the same
handshake as the gRPC transport, minus the wire."""
from __future__ import annotations

from typing import Iterator, Mapping

from speckv.services.kvstore.replication import Chunk, TransferOrder
from speckv.services.kvstore.reservations import Grant
from speckv.services.kvstore.store import KVStoreCore


class LocalTarget:
    transport = "local"
    zero_copy = False  # chunks are written with write_chunk, from packed bytes

    def __init__(self, target: KVStoreCore) -> None:
        self.target = target

    def reserve(self, order: TransferOrder, lease_s: float) -> Grant:
        return self.target.reserve(order.order_id, list(order.block_hashes), lease_s, family=order.family,
                                   parent=order.parent, source_node=order.source_node, tier=order.tier,
                                   engine_save=order.pull)  # a pull's copy is the node's own KV, as a save

    def write_chunks(self, handle: str, chunks: Iterator[Chunk], total_bytes: int) -> int:
        received = 0
        for chunk in chunks:
            received = self.target.write_chunk(handle, chunk.offset, chunk.data, chunk.crc32c)
        return received

    def commit(self, handle: str, chunk_crcs: Mapping[int, int], replica_lease_s: float) -> int:
        return self.target.commit(handle, chunk_crcs, replica_lease_s)

    def abort(self, handle: str, reason: str) -> None:
        self.target.abort(handle, reason)

    def close(self) -> None:
        pass
