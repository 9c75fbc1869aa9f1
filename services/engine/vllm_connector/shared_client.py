"""The connector's same-host path to its kvstore: the kvstore's pools mapped
into the engine's process (services/kvstore/shm), so a load or a save is one
strided copy between the pool's pages and the engine's, with gRPC carrying
only control (MapBlocks / Unpin, Reserve / Commit with shared_memory).

open() answers None when the kvstore is on another host, runs as another
user, shares nothing (a GPU pool, or --no-shared-memory) or cannot be asked:
the connector then moves bytes over gRPC (kvstore_client.py). Every later
failure is answered None / False and counted, never raised, so the engine
recomputes (fail open).

Every MapBlocks and Reserve answer names the arena of its pages (a token);
one that is not the arena mapped here (the kvstore restarted at the same
address) is not used: the call fails open and the pools are mapped again.

Reads hold their blocks pinned under a lease measured from before the call,
so if the copy ends before lease_s has passed on this process's clock, the
kvstore had kept the pages unchanged throughout; a copy that ends later is
reported as a load error (the pages may have been reused).
"""
from __future__ import annotations

import logging
import threading
import uuid
from typing import Sequence

import grpc
import numpy as np

from speckv.services.common.rpc.geometry_proto import geometry_from_proto
from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.kvstore_client import map_blocks, unpin
from speckv.services.engine.vllm_connector.port import ReadLease, WriteSlot
from speckv.services.kvstore.shm.mapped_pool import MappedPools
from speckv.services.kvstore.shm_proto import offered_pools
from speckv.services.common.errors import SpeckvError
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc

log = logging.getLogger("speckv.vllm_connector")


class SharedKVStore:
    """A port.SharedPort over the kvstore's gRPC control calls."""


    def __init__(self, stub: kvstore_pb2_grpc.KVStoreStub, address: str, pools: MappedPools, counters: Counters,
                 timeout_s: float, lease_s: float) -> None:
        self._stub = stub
        self._address = address
        self.pools = pools
        self._counters = counters
        self._timeout_s = timeout_s
        self._lease_s = lease_s
        self._remap_lock = threading.Lock()  # the loader thread and the step's saves may both find pools stale

    @classmethod
    def open(cls, stub: kvstore_pb2_grpc.KVStoreStub, address: str, counters: Counters, timeout_s: float,
             lease_s: float) -> "SharedKVStore | None":
        try:
            reply = stub.OpenSharedPools(kvstore_pb2.OpenSharedPoolsRequest(), timeout=timeout_s)
        except grpc.RpcError as error:
            log.info("speckv kvstore %s: no shared memory (%s); KV moves over gRPC", address, _code(error))
            return None
        infos, why_not = offered_pools(reply)
        if why_not:
            log.info("speckv kvstore %s: %s; KV moves over gRPC", address, why_not)
            return None
        try:
            pools = MappedPools(infos, geometry_from_proto(reply.geometry))
        except SpeckvError as error:
            log.warning("speckv kvstore %s: cannot map its pools (%s); KV moves over gRPC", address, error)
            return None
        log.info("speckv kvstore %s: pools mapped (%s); KV moves through shared memory", address,
                 ", ".join(sorted(pools.pools)))
        return cls(stub, address, pools, counters, timeout_s, lease_s)

    def map_for_read(self, ids: Sequence[int]) -> ReadLease | None:
        """Pins the blocks and says where they lie; None on any failure."""
        try:
            lease = map_blocks(self._stub, ids, self._lease_s, self._timeout_s)
        except grpc.RpcError as error:
            self._counters.add(load_failures=1)
            log.warning("speckv kvstore: map of %d blocks failed (%s); the engine recomputes", len(ids), _code(error))
            return None
        if self.pools_for(lease) is None:
            self.release(lease)
            return None
        return lease

    def pools_for(self, lease: ReadLease) -> MappedPools | None:
        """The mapped pools the lease's pages lie in, taken once: a copy reads
        from this object even if another thread remaps meanwhile. None (and
        the pools mapped again for the next call) when they are not these."""
        pools = self.pools
        if all(token == pools.token(medium) for medium, token in lease.tokens.items()):
            return pools
        self._stale("a read", pools)
        return None

    def release(self, lease: ReadLease) -> None:
        unpin(self._stub, lease, self._timeout_s)

    def reserve(self, ids: Sequence[int], parent: int | None, family: str) -> WriteSlot | None:
        """Pages for the blocks of ids the kvstore lacks; None on failure."""
        request = kvstore_pb2.ReserveRequest(
            order_id=f"vllm-save-{uuid.uuid4().hex[:12]}", block_hashes=list(ids),
            lease_ms=max(1, round(self._lease_s * 1000)), family=family, parent_hash=parent or 0,
            has_parent=parent is not None, shared_memory=True, engine_save=True)
        try:
            reply = self._stub.Reserve(request, timeout=self._timeout_s)
        except grpc.RpcError as error:
            self._counters.add(save_failures=1)
            log.warning("speckv kvstore: reserve of %d blocks failed (%s); they stay engine-only", len(ids),
                        _code(error))
            return None
        slot = WriteSlot(reply.handle, (), (), reply.pages_medium, reply.capability, reply.capability_secret)
        pools = self.pools
        if reply.pages_token != pools.token(reply.pages_medium):
            self._stale("a save", pools)
            self.abort(slot, "the writer mapped another arena")
            return None
        where = {block_id: i for i, block_id in enumerate(ids)}
        positions = tuple(where[h] for h in reply.block_hashes)
        self._counters.add(blocks_already_present=len(ids) - len(positions))
        return WriteSlot(reply.handle, positions, tuple(reply.pages), reply.pages_medium, reply.capability,
                         reply.capability_secret)

    def commit(self, slot: WriteSlot) -> bool:
        """Checksums the written pages and commits; False on failure (aborted)."""
        crcs = self.pools.blocks_crcs(slot.medium, slot.pages)
        try:
            self._stub.Commit(kvstore_pb2.CommitRequest(handle=slot.handle, chunk_crc32c=crcs, shared_memory=True,
                                                        capability=slot.capability,
                                                        capability_secret=slot.secret), timeout=self._timeout_s)
        except grpc.RpcError as error:
            self._counters.add(save_failures=1)
            log.warning("speckv kvstore: commit of %d blocks failed (%s); they stay engine-only", len(slot.pages),
                        _code(error))
            self.abort(slot, "commit failed")
            return False
        self._counters.add(blocks_saved=len(slot.pages), blocks_saved_shared=len(slot.pages))
        return True

    def abort(self, slot: WriteSlot, reason: str) -> None:
        try:
            self._stub.Abort(kvstore_pb2.AbortRequest(handle=slot.handle, reason=reason, capability=slot.capability,
                                                      capability_secret=slot.secret), timeout=self._timeout_s)
        except grpc.RpcError:
            pass  # its lease reaps it

    def _stale(self, what: str, seen: MappedPools) -> None:
        """The kvstore answered with arenas other than `seen` (it restarted):
        this call fails open, the pools are mapped again for the next (once,
        whichever thread finds it first). The old mapping is not closed here:
        a copy on another thread may still read it; it goes with its last
        reference."""
        with self._remap_lock:
            if self.pools is not seen:
                return  # another thread has remapped already
            self._counters.add(shared_remaps=1)
            log.warning("speckv kvstore %s: its shared pools changed (restarted?); %s falls back, pools remapped",
                        self._address, what)
            fresh = SharedKVStore.open(self._stub, self._address, self._counters, self._timeout_s, self._lease_s)
            if fresh is not None:
                self.pools = fresh.pools

    def pool(self, medium: str) -> np.ndarray:
        return self.pools.pool(medium)

    def close(self) -> None:
        self.pools.close()


def _code(error: grpc.RpcError) -> str:
    code = error.code() if hasattr(error, "code") else None
    return code.name if code is not None else type(error).__name__
