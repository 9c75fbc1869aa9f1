"""ReplicationTarget over the target kvstore's gRPC API (Reserve,
WriteChunks, Commit, Abort). Not core: it owns a channel.

Every call carries a deadline: unary calls `timeout_s`; the chunk stream
timeout_s plus the time its bytes take at `min_rate_bytes_s`. gRPC errors come
back as the domain error of the same status (UNAVAILABLE and
DEADLINE_EXCEEDED as Unavailable), prefixed with the target address.
"""
from __future__ import annotations

import time
from typing import Iterator, Mapping, Sequence

import grpc

from speckv.services.common import errors
from speckv.services.common.ids import BlockHash
from speckv.services.common.rpc.interceptor import STATUS_OF_ERROR
from speckv.services.common.rpc.server import MIB, open_channel
from speckv.services.common.rpc.telemetry import Telemetry
from speckv.services.common.rpc.tls import TlsMaterial
from speckv.services.kvstore.token_bucket import TokenBucket
from speckv.services.kvstore.replication import Chunk, TransferOrder
from speckv.services.kvstore.reservations import Grant, Handle
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc

ERROR_OF_STATUS = {code: cls for cls, code in STATUS_OF_ERROR.items()}


def domain_error(exc: grpc.RpcError, address: str, what: str) -> errors.SpeckvError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    cls = ERROR_OF_STATUS.get(code, errors.Unavailable)
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return cls(f"target {address}: {what}: {code.name}: {details}")


def paced(chunks: Iterator[Chunk], bucket: TokenBucket | None) -> Iterator[Chunk]:
    """chunks, each let through only when the link cap allows its bytes."""
    for chunk in chunks:
        if bucket is not None:
            wait = bucket.take(len(chunk.data))
            if wait > 0:
                time.sleep(wait)
        yield chunk


def _as_bytes(data: object) -> bytes:
    return data if isinstance(data, bytes) else bytes(memoryview(data))  # type: ignore[arg-type]


class GrpcReplicationTarget:
    """The control calls, and the WriteChunks fallback data plane."""

    transport = "grpc"
    zero_copy = False  # protobuf needs the bytes packed

    def __init__(self, address: str, telemetry: Telemetry | None, *, timeout_s: float = 10.0,
                 min_rate_bytes_s: float = 20 * MIB, max_message_bytes: int = 64 * MIB,
                 bucket: TokenBucket | None = None, tls: TlsMaterial | None = None) -> None:
        self.address = address
        self.bucket = bucket
        self.capability = b""  # the last Reserve's write capability: presented with every later call
        self.secret = b""  # and its secret (this channel is the control plane's: mutual TLS when TLS is on)
        self._timeout_s = timeout_s
        self._min_rate = min_rate_bytes_s
        self._channel = open_channel(address, telemetry, max_message_bytes, tls, "kvstore")
        self._stub = kvstore_pb2_grpc.KVStoreStub(self._channel)

    @property
    def stub(self) -> kvstore_pb2_grpc.KVStoreStub:
        return self._stub

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def reserve(self, order: TransferOrder, lease_s: float, shared_memory: bool = False, nixl: bool = False) -> Grant:
        """shared_memory, nixl: the writer fills the pages itself (shm_target.py,
        nixl/target.py); the grant names them."""
        request = kvstore_pb2.ReserveRequest(
            order_id=order.order_id, block_hashes=order.block_hashes, lease_ms=max(1, round(lease_s * 1000)),
            source_node=order.source_node, family=order.family,
            parent_hash=order.parent or 0, has_parent=order.parent is not None, medium=order.tier.medium,
            shared_memory=shared_memory, nixl=nixl, pull=order.pull)
        try:
            reply = self._stub.Reserve(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise domain_error(exc, self.address, f"Reserve for order {order.order_id}") from None
        self.capability = reply.capability
        self.secret = reply.capability_secret
        return Grant(Handle(reply.handle), tuple(BlockHash(h) for h in reply.block_hashes),
                     reply.bytes_per_block, reply.lease_deadline_s, reply.data_address, reply.capability,
                     reply.capability_secret, tuple(reply.pages), reply.pages_medium, reply.pages_token)

    def write_chunks(self, handle: str, chunks: Iterator[Chunk], total_bytes: int) -> int:
        # protobuf needs bytes: the one copy this fallback cannot avoid.
        requests = (kvstore_pb2.WriteChunkRequest(handle=handle, offset=c.offset, data=_as_bytes(c.data),
                                                  crc32c=c.crc32c, capability=self.capability,
                                                  capability_secret=self.secret)
                    for c in paced(chunks, self.bucket))
        rate = min(self._min_rate, self.bucket.rate) if self.bucket is not None else self._min_rate
        timeout = self._timeout_s + total_bytes / rate
        try:
            return self._stub.WriteChunks(requests, timeout=timeout).bytes_received
        except grpc.RpcError as exc:
            raise domain_error(exc, self.address, f"WriteChunks to {handle}") from None

    def commit(self, handle: str, chunk_crcs: Mapping[int, int], replica_lease_s: float,
               shared_memory: bool = False, segment_crcs: Sequence[int] = (), nixl_batches: bool = False) -> int:
        """nixl_batches: each chunk was a NIXL transfer that notified the
        target as it landed (nixl/target.py)."""
        request = kvstore_pb2.CommitRequest(
            handle=handle, chunk_crc32c=dict(chunk_crcs), replica_lease_ms=round(replica_lease_s * 1000),
            capability=self.capability, capability_secret=self.secret, shared_memory=shared_memory,
            segment_crc32c=segment_crcs, nixl_batches=nixl_batches)
        try:
            return self._stub.Commit(request, timeout=self._timeout_s).blocks_committed
        except grpc.RpcError as exc:
            raise domain_error(exc, self.address, f"Commit of {handle}") from None

    def abort(self, handle: str, reason: str) -> None:
        try:
            self._stub.Abort(kvstore_pb2.AbortRequest(handle=handle, reason=reason[:1000], capability=self.capability,
                                                      capability_secret=self.secret),
                             timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise domain_error(exc, self.address, f"Abort of {handle}") from None

    def close(self) -> None:
        self._channel.close()
