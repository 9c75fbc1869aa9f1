"""ReplicationTarget through shared memory, for a target kvstore on this
host: Reserve, Commit and Abort stay on gRPC (GrpcReplicationTarget); the
bytes go from the source pool's pinned pages straight into the target's
reserved pages, mapped here (shm/mapped_pool.py): one memcpy per segment, no
socket, no staging. Not core: it calls the target over gRPC.

Per order: OpenSharedPools says whether the target shares its pools and runs
on this kernel; its arenas are mapped once and kept (SharedPoolsCache) until
the target answers other ones (a restart) or stops answering (then they are
unmapped, so a dead target's memory is not kept alive here). When it does not share them (another
host, another user, a GPU pool, --no-shared-memory) the order goes to the
fallback transport instead (NIXL where both ends have it, else TCP; under
--transport auto), and the result names the transport used.

From a host pool the source hands over its pinned pool and pages
(copy_pages): one memcpy per (layer, K/V) and run of consecutive pages, each
landed segment checksummed while hot and compared with the source's cached
checksum, so the copy is checked end to end in one pass; Commit carries
those segment checksums, which the target keeps instead of reading its
pages again (store_shared.py). Packed chunks (write_chunks: a GPU source)
are copied piece by piece and checked by the target at commit. The node's link
cap (token bucket) paces the copies as it paces TCP sends.
"""
from __future__ import annotations

import threading
import time
from typing import Iterator, Mapping, Sequence

import grpc
import numpy as np

from speckv.services.common import errors
from speckv.services.common.rpc.geometry_proto import geometry_from_proto
from speckv.services.kvstore.grpc_target import GrpcReplicationTarget, domain_error
from speckv.services.kvstore.replication import Chunk, ReplicationTarget, TransferOrder
from speckv.services.kvstore.reservations import Grant
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.segments import SegmentLayout
from speckv.services.kvstore.shm.mapped_pool import MappedPools, fold_block_crcs
from speckv.services.kvstore.shm_proto import offered_pools
from speckv.services.kvstore.shm.runs import paired_runs
from speckv.services.kvstore.token_bucket import TokenBucket
from speckv.v1 import kvstore_pb2


class SharedPoolsCache:
    """Mapped pools of same-host targets, by address (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mapped: dict[str, tuple[tuple[str, ...], MappedPools]] = {}

    def pools_of(self, control: GrpcReplicationTarget) -> MappedPools | None:
        """The target's pools mapped here; None when it shares none with this
        process (then use another transport)."""
        try:
            reply = control.stub.OpenSharedPools(kvstore_pb2.OpenSharedPoolsRequest(), timeout=control.timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None  # an older kvstore
            raise domain_error(exc, control.address, "OpenSharedPools") from None
        infos, why_not = offered_pools(reply)
        if why_not:
            return None
        tokens = tuple(info.address.token for info in infos)
        with self._lock:
            known = self._mapped.get(control.address)
            if known is not None and known[0] == tokens:
                return known[1]
            try:
                pools = MappedPools(infos, geometry_from_proto(reply.geometry))
            except errors.FailedPrecondition:
                return None  # another user, or it restarted meanwhile: the fallback carries this order
            if known is not None:
                known[1].close()
            self._mapped[control.address] = (tokens, pools)
            return pools

    def forget(self, address: str) -> None:
        """Unmaps address's pools (after a failure: a dead target's memory
        lives as long as anyone maps it)."""
        with self._lock:
            known = self._mapped.pop(address, None)
        if known is not None:
            known[1].close()

    def close(self) -> None:
        with self._lock:
            for _, pools in self._mapped.values():
                pools.close()
            self._mapped.clear()


class ShmReplicationTarget:
    def __init__(self, control: GrpcReplicationTarget, fallback: ReplicationTarget, cache: SharedPoolsCache,
                 bucket: TokenBucket | None = None) -> None:
        """fallback: the transport of a target that shares no pool with this
        process, over the same control channel (closing it closes both)."""
        self._control = control
        self._fallback = fallback
        self._cache = cache
        self._bucket = bucket
        self._pools: MappedPools | None = None
        self._grant: Grant | None = None
        self._landed: np.ndarray | None = None  # segment checksums of what copy_pages wrote
        self.transport = "shm"

    @property
    def zero_copy(self) -> bool:
        return self._fallback.zero_copy if self._pools is None else True

    def reserve(self, order: TransferOrder, lease_s: float) -> Grant:
        self._pools = self._cache.pools_of(self._control)
        if self._pools is None:
            grant = self._fallback.reserve(order, lease_s)
            self.transport = self._fallback.transport
            return grant
        self._grant = self._control.reserve(order, lease_s, shared_memory=True)
        if self._grant.pages_token != self._pools.token(self._grant.pages_medium):
            # The target restarted since its pools were mapped: these pages are in arenas not mapped here.
            self._control.abort(self._grant.handle, "the writer mapped another arena")
            self._cache.forget(self._control.address)
            raise errors.Unavailable(f"target {self._control.address} restarted (new shared pools); retry the order")
        return self._grant

    def write_chunks(self, handle: str, chunks: Iterator[Chunk], total_bytes: int) -> int:
        if self._pools is None:
            return self._fallback.write_chunks(handle, chunks, total_bytes)
        grant = self._grant
        assert grant is not None and grant.handle == handle
        flat = self._pools.flat(grant.pages_medium)
        g = self._pools.geometry
        layout = SegmentLayout(2 * g.num_layers, flat.size // g.bytes_per_block, g.segment_bytes)
        written = 0
        for chunk in chunks:
            size = chunk.nbytes
            self._pace(size)
            if chunk.offset < 0 or chunk.offset + size > len(grant.pages) * g.bytes_per_block:
                raise errors.InvalidArgument(f"chunk {chunk.offset}+{size} outside reservation {handle}")
            targets = [flat[p.lo:p.hi] for p in layout.pieces(list(grant.pages), chunk.offset, size)]
            _copy(chunk.pieces or (memoryview(chunk.data).cast("B"),), targets)  # type: ignore[arg-type]
            written += size
        return written

    @property
    def copies_pages(self) -> bool:
        """Whether the source should hand its pool to copy_pages (not chunks):
        shared memory, or a fallback that copies pages itself (NIXL)."""
        return self._pools is not None or bool(getattr(self._fallback, "copies_pages", False))

    def copy_pages(self, handle: str, source: np.ndarray, source_pages: Sequence[int],
                   source_crcs: np.ndarray) -> None:
        """Copies the source pool's pages into the reservation's pages, one
        memcpy per (layer, K/V) and run of consecutive pages on both sides,
        checksums every landed segment while it is hot and compares it with
        the source's (source_crcs: [pages, 2 * layers]); Aborted on a mismatch."""
        if self._pools is None:
            self._fallback.copy_pages(handle, source, source_pages, source_crcs)  # type: ignore[attr-defined]
            return
        grant, pools = self._grant, self._pools
        assert grant is not None and pools is not None and grant.handle == handle
        target = pools.pool(grant.pages_medium)
        if source.shape[:2] != target.shape[:2] or source.shape[3:] != target.shape[3:] \
                or source.dtype != target.dtype:
            raise errors.FailedPrecondition(f"target {self._control.address}: pool {target.shape} {target.dtype} "
                                            f"is not this node's geometry {source.shape} {source.dtype}")
        landed = np.empty_like(source_crcs)
        block_bytes = pools.geometry.bytes_per_block
        for run in paired_runs(source_pages, grant.pages):
            self._pace(run.count * block_bytes)
            for layer in range(target.shape[0]):
                for kv in range(2):
                    into = target[layer, kv, run.dst:run.dst + run.count]
                    into[...] = source[layer, kv, run.src:run.src + run.count]
                    for i in range(run.count):
                        landed[run.at + i, 2 * layer + kv] = crc32c(into[i])
        if not np.array_equal(landed, source_crcs):
            raise errors.Aborted(f"target {self._control.address}: bytes copied into reservation {handle} differ "
                                 "from the source's (crc32c)")
        self._landed = landed

    def commit(self, handle: str, chunk_crcs: Mapping[int, int], replica_lease_s: float) -> int:
        if self._pools is None:
            return self._fallback.commit(handle, chunk_crcs, replica_lease_s)
        segments: Sequence[int] = ()
        if self._landed is not None:  # copy_pages checked every segment: send them, and a checksum per block
            chunk_crcs = fold_block_crcs(self._landed, self._pools.geometry.segment_bytes,
                                         self._pools.geometry.bytes_per_block)
            segments = self._landed.reshape(-1).tolist()
        try:
            return self._control.commit(handle, chunk_crcs, replica_lease_s, shared_memory=True,
                                        segment_crcs=segments)
        except errors.Unavailable:
            self._cache.forget(self._control.address)
            raise

    def abort(self, handle: str, reason: str) -> None:
        (self._fallback if self._pools is None else self._control).abort(handle, reason)

    def close(self) -> None:
        self._fallback.close()  # it shares the control channel and closes it

    def _pace(self, nbytes: int) -> None:
        if self._bucket is not None:
            wait = self._bucket.take(nbytes)
            if wait > 0:
                time.sleep(wait)


def _copy(sources: tuple[memoryview, ...], targets: list[np.ndarray]) -> None:
    """Streams the bytes of sources, in order, into targets, in order (equal
    totals); where the pieces line up (the same geometry on both ends) each
    is one memcpy."""
    t, t_at = 0, 0
    for source in sources:
        src = np.frombuffer(source, dtype=np.uint8)
        s_at = 0
        while s_at < src.size:
            target = targets[t]
            n = min(src.size - s_at, target.size - t_at)
            target[t_at:t_at + n] = src[s_at:s_at + n]
            s_at += n
            t_at += n
            if t_at == target.size:
                t, t_at = t + 1, 0
