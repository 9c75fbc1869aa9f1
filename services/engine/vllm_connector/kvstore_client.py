"""The connector's calls to the node's kvstore (protos/speckv/v1/kvstore.proto)
over gRPC, failing open: every failure (the kvstore down, slow past its
deadline, a block missing or failing its crc32c) is counted, logged, and
answered as "nothing" so that the engine recomputes; no call raises.

Bytes travel as gRPC messages (one per block); on the kvstore's host
shared_client.py moves them through its mapped pools. With
`pin_at_lookup`, the lookup is MapBlocks(prefix): the blocks found are
pinned until the worker has read them (release), so none is evicted between
the lookup and the load, and the worker's load needs no call of its own.
"""
from __future__ import annotations

import logging
import time
from typing import Sequence

import crc32c
import grpc

from speckv.services.common.rpc.tls import TlsMaterial, dial
from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.port import ReadLease
from speckv.v1 import common_pb2, kvstore_pb2, kvstore_pb2_grpc

log = logging.getLogger("speckv.vllm_connector")
MIB = 1 << 20
PEER_BACKOFF_S = 2.0  # a peer whose lookup failed is not asked for this long, doubling per failure
PEER_BACKOFF_MAX_S = 60.0


def map_blocks(stub: kvstore_pb2_grpc.KVStoreStub, ids: Sequence[int], lease_s: float, timeout_s: float,
               prefix: bool = False) -> ReadLease:
    """MapBlocks as a ReadLease, its lease measured from before the call (so
    it ends here first); grpc.RpcError as raised."""
    started = time.monotonic()
    reply = stub.MapBlocks(kvstore_pb2.MapBlocksRequest(block_hashes=list(ids), prefix=prefix,
                                                        lease_ms=max(1, round(lease_s * 1000))), timeout=timeout_s)
    held = len(reply.pages)
    return ReadLease(tuple(ids[:held]), tuple(reply.pages), tuple(reply.media), dict(reply.pool_tokens),
                     started + min(reply.lease_s or lease_s, lease_s))


def unpin(stub: kvstore_pb2_grpc.KVStoreStub, lease: ReadLease, timeout_s: float) -> None:
    if not lease.ids:
        return
    try:
        stub.Unpin(kvstore_pb2.PinRequest(block_hashes=list(lease.ids)), timeout=timeout_s)
    except grpc.RpcError as error:  # the lease ends the pins anyway
        log.info("speckv kvstore: unpin of %d blocks failed (%s); their lease ends them", len(lease.ids),
                 _code(error))


class KVStoreClient:
    """One channel to one kvstore (a port.KVStorePort). Deadlines in seconds."""

    def __init__(self, address: str, counters: Counters, lookup_timeout_s: float = 0.5,
                 transfer_timeout_s: float = 10.0, max_message_mb: int = 64, pin_at_lookup: bool = False,
                 tls: TlsMaterial | None = None, peer: bool = False) -> None:
        """tls: mutual TLS as the node's engine (the kvstore must serve TLS); None: plaintext;
        peer: another node's kvstore (pulls): its lookups count as peer_lookups."""
        # bdp_probe off: large streamed messages are much faster on loopback without it (DESIGN.md, "Facts measured on these machines")
        options = [("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", max_message_mb * MIB),
                   ("grpc.max_send_message_length", max_message_mb * MIB)]
        self.address = address
        self._channel = dial(address, tls, "kvstore", options)
        self.stub = kvstore_pb2_grpc.KVStoreStub(self._channel)
        self._counters = counters
        self._lookup_timeout_s = lookup_timeout_s
        self._transfer_timeout_s = transfer_timeout_s
        self._pin_at_lookup = pin_at_lookup  # turned off for good when the kvstore cannot map
        self._lookups, self._lookup_failures = ("peer_lookups", "peer_lookup_failures") if peer else \
            ("lookups", "lookup_failures")
        # A peer whose lookup failed is not asked again for a while (doubling from PEER_BACKOFF_S up to
        # PEER_BACKOFF_MAX_S): a black-holed peer would otherwise cost lookup_timeout_s inside vLLM's
        # scheduler step for every request that names it. 0: ask (this node's own kvstore always is).
        self._peer = peer
        self._quiet_until = 0.0
        self._backoff_s = PEER_BACKOFF_S

    def close(self) -> None:
        self._channel.close()

    def prefix_blocks(self, ids: Sequence[int]) -> int:
        """How many of ids, from the first, the kvstore holds; 0 on failure
        (and, for a peer, while it backs off after one)."""
        if not ids or (self._peer and time.monotonic() < self._quiet_until):
            return 0
        self._counters.add(**{self._lookups: 1})
        try:
            reply = self.stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=list(ids)),
                                      timeout=self._lookup_timeout_s)
        except grpc.RpcError as error:
            self._counters.add(**{self._lookup_failures: 1})
            if self._peer:
                self._quiet_until = time.monotonic() + self._backoff_s
                log.warning("speckv peer kvstore %s: lookup failed (%s); not asked again for %.0f s, its pulls "
                            "are recomputed", self.address, _code(error), self._backoff_s)
                self._backoff_s = min(self._backoff_s * 2, PEER_BACKOFF_MAX_S)
            else:
                log.warning("speckv kvstore %s: lookup failed (%s); the engine recomputes", self.address,
                            _code(error))
            return 0
        self._backoff_s = PEER_BACKOFF_S
        return int(reply.prefix_blocks)

    def map_prefix(self, ids: Sequence[int]) -> ReadLease | None:
        if not ids or not self._pin_at_lookup:
            return None
        self._counters.add(**{self._lookups: 1})
        try:
            return map_blocks(self.stub, ids, self._transfer_timeout_s, self._lookup_timeout_s, prefix=True)
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED):
                self._pin_at_lookup = False  # private pools, or an older kvstore: Lookup from now on
                log.info("speckv kvstore %s: no shared pages to pin (%s); lookups only", self.address, _code(error))
            else:
                self._counters.add(**{self._lookup_failures: 1})
                log.warning("speckv kvstore %s: lookup failed (%s); the engine recomputes", self.address,
                            _code(error))
            return None

    def release(self, lease: ReadLease) -> None:
        unpin(self.stub, lease, self._transfer_timeout_s)

    def get(self, ids: Sequence[int]) -> list[bytes] | None:
        """The blocks' canonical bytes in order, each checked against its
        crc32c; None when any is missing, corrupt or the call fails."""
        try:
            replies = list(self.stub.GetBlocks(kvstore_pb2.GetBlocksRequest(block_hashes=list(ids)),
                                                timeout=self._transfer_timeout_s))
        except grpc.RpcError as error:
            self._counters.add(load_failures=1)
            log.warning("speckv kvstore %s: load of %d blocks failed (%s); the engine recomputes them",
                        self.address, len(ids), _code(error))
            return None
        got = [r.block_hash for r in replies]
        if got != list(ids):
            self._counters.add(load_failures=1)
            log.warning("speckv kvstore %s: asked %d blocks, got %d (evicted meanwhile?); the engine recomputes",
                        self.address, len(ids), len(got))
            return None
        for reply in replies:
            if crc32c.crc32c(reply.data) != reply.crc32c:
                self._counters.add(load_failures=1)
                log.warning("speckv kvstore %s: block %016x failed its crc32c; the engine recomputes",
                            self.address, reply.block_hash)
                return None
        return [r.data for r in replies]

    def replicate_to(self, target_node: str, target_address: str, ids: Sequence[int], family: str,
                     order_id: str) -> int | None:
        """Asks this (a peer's) kvstore to copy the blocks into target's
        kvstore over its data plane (Replicate: a pull into target, which
        target's engine may ask for): how many it copied once every block
        is there (those target held already are not copied), None on failure."""
        order = common_pb2.ReplicationOrder(order_id=order_id, family=family, block_hashes=list(ids),
                                            source_node="", target_node=target_node,
                                            target_address=target_address, policy="pull")
        try:
            reply = self.stub.Replicate(kvstore_pb2.ReplicateRequest(order=order, pull=True),
                                        timeout=self._transfer_timeout_s)
        except grpc.RpcError as error:
            log.warning("speckv kvstore %s: pull of %d blocks into %s failed (%s); the engine recomputes them",
                        self.address, len(ids), target_node, _code(error))
            return None
        if reply.state != common_pb2.ORDER_STATE_COMMITTED:
            log.warning("speckv kvstore %s: pull of %d blocks into %s ended %s (%s); the engine recomputes them",
                        self.address, len(ids), target_node, common_pb2.OrderState.Name(reply.state), reply.message)
            return None
        return int(reply.blocks_sent)

    def node_id(self) -> str:
        """The kvstore's node id ("" when it cannot be asked now)."""
        try:
            return self.stub.GetStats(kvstore_pb2.StatsRequest(), timeout=self._lookup_timeout_s * 4).node_id
        except grpc.RpcError:
            return ""

    def put(self, ids: Sequence[int], parents: Sequence[int | None], family: str,
            data: Sequence[bytes]) -> None:
        """Store the blocks (chained by parents); existing ids stay as they are."""
        messages = (kvstore_pb2.PutBlockRequest(block_hash=i, data=d, family=family, parent_hash=p or 0,
                                                has_parent=p is not None)
                    for i, p, d in zip(ids, parents, data))
        try:
            reply = self.stub.PutBlocks(messages, timeout=self._transfer_timeout_s)
        except grpc.RpcError as error:
            self._counters.add(save_failures=1)
            log.warning("speckv kvstore %s: save of %d blocks failed (%s); they stay engine-only",
                        self.address, len(ids), _code(error))
            return
        self._counters.add(blocks_saved=reply.stored, blocks_already_present=reply.already_present)


def _code(error: grpc.RpcError) -> str:
    code = error.code() if hasattr(error, "code") else None
    return code.name if code is not None else type(error).__name__
