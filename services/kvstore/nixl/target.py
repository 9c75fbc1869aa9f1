"""ReplicationTarget over NIXL, for a target kvstore with a NIXL agent:
Reserve, Commit and Abort stay on gRPC (GrpcReplicationTarget); the bytes go
by NIXL WRITE from the source pool's pinned pages straight into the
target's reserved pages (one descriptor pair per (layer, K/V) and run of
consecutive pages, layout.py). Not core: it calls the target over gRPC and
NIXL.

Per order: this kvstore's agent must exist (NIXL installed, --nixl on), the
target must answer NixlMetadata with a pool for the order's tier (a GPU pool
is not registered: tcp) (an older kvstore, or one without NIXL, does not:
tcp). The target's metadata is loaded into the agent once and kept
(NixlPeers) until its Reserve names another agent (a restart: the
reservation is aborted, the old agent dropped, the order fails UNAVAILABLE
and its retry loads the new one) or a commit fails UNAVAILABLE. Without
NIXL the order goes to the fallback (TCP), and the result names it.

Checking: the copy is cut into batches of batch_bytes (whole blocks), one
NIXL transfer each, WINDOW in flight. Where the target says it takes batch
notes (NixlMetadataResponse.batch_notes), each transfer carries one
(batch_note.py: the batch's range and crc32c, folded from the source's
cached segment checksums), which NIXL delivers once its bytes have landed;
the target checksums them then (landing.py), while the next batches land,
and Commit (with nixl_batches) carries each batch's crc32c and waits only
for the last checks. An older target gets no notes and the crc32c of every
block; it reads its pages at commit. Either way the target compares the
bytes it holds with the writer's checksums (it does not take a remote
writer's word for what landed). Nothing is visible before that commit; an
abort or the reservation's lease frees the pages. The node's link cap
paces the transfers, batch by batch.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import grpc
import numpy as np

from speckv.services.common import errors
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.rpc.geometry_proto import geometry_from_proto
from speckv.services.kvstore.grpc_target import GrpcReplicationTarget, domain_error
from speckv.services.kvstore.nixl.agent import NixlAgent
from speckv.services.kvstore.nixl.batch_note import batch_crcs, notes_for
from speckv.services.kvstore.nixl.layout import PoolRegion, write_batches
from speckv.services.kvstore.replication import Chunk, ReplicationTarget, TransferOrder
from speckv.services.kvstore.reservations import Grant
from speckv.services.kvstore.shm.mapped_pool import fold_block_crcs
from speckv.services.kvstore.token_bucket import TokenBucket
from speckv.v1 import kvstore_pb2

MIN_RATE_BYTES_S = 20 * 1024 * 1024  # a transfer's deadline: peer timeout + its bytes at this rate
BATCH_BYTES = 8 * 1024 * 1024  # one NIXL transfer (and target check): 8-16 MiB, 2-8 in flight, ran alike (journal)


@dataclass(frozen=True, slots=True)
class RemoteAgent:
    """A target kvstore's agent, loaded into ours."""

    name: str
    pools: dict[str, PoolRegion]  # medium -> its registered pool
    geometry: KVGeometry
    batch_notes: bool = False  # it checks each batch as it lands (landing.py)


class NixlPeers:
    """Target agents loaded into this kvstore's agent, by address (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, RemoteAgent] = {}

    def remote_of(self, control: GrpcReplicationTarget, agent: NixlAgent) -> RemoteAgent | None:
        """The target's agent, loaded; None when the target has none."""
        with self._lock:  # one load per target even when orders to it start together
            known = self._known.get(control.address)
            if known is not None:
                return known
            try:
                reply = control.stub.NixlMetadata(kvstore_pb2.NixlMetadataRequest(), timeout=control.timeout_s)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION):
                    return None  # an older kvstore, or one without NIXL
                raise domain_error(exc, control.address, "NixlMetadata") from None
            geometry = geometry_from_proto(reply.geometry)
            name = agent.load_remote(reply.metadata)
            if name != reply.agent_name:
                agent.forget_remote(name)
                raise errors.FailedPrecondition(f"target {control.address}: NIXL metadata of agent {name!r}, "
                                                f"answered as {reply.agent_name!r}")
            pools = {p.medium: PoolRegion(p.address, p.num_pages, geometry.num_layers, geometry.segment_bytes)
                     for p in reply.pools}
            known = self._known[control.address] = RemoteAgent(name, pools, geometry, reply.batch_notes)
            return known

    def forget(self, address: str, agent: NixlAgent) -> None:
        with self._lock:
            known = self._known.pop(address, None)
        if known is not None:
            agent.forget_remote(known.name)


class NixlReplicationTarget:
    def __init__(self, control: GrpcReplicationTarget, fallback: ReplicationTarget, peers: NixlPeers,
                 agent: Callable[[], NixlAgent | None], bucket: TokenBucket | None = None,
                 batch_bytes: int = BATCH_BYTES) -> None:
        """agent: this kvstore's agent (None: no NIXL here); fallback: the
        transport when either end lacks NIXL, over the same control channel
        (closing it closes both); batch_bytes: the bytes of one NIXL
        transfer, rounded down to whole blocks (at least one)."""
        self._control = control
        self._fallback = fallback
        self._peers = peers
        self._agent_of = agent
        self._bucket = bucket
        self._batch_bytes = batch_bytes
        self._agent: NixlAgent | None = None
        self._remote: RemoteAgent | None = None
        self._grant: Grant | None = None
        self._crcs: dict[int, int] = {}
        self._noted = False  # the batches carried notes: commit with nixl_batches
        self.transport = "nixl"

    @property
    def active(self) -> bool:
        """Whether this order's bytes go by NIXL (known after reserve)."""
        return self._remote is not None

    @property
    def zero_copy(self) -> bool:
        return True if self.active else self._fallback.zero_copy

    @property
    def copies_pages(self) -> bool:
        return self.active

    def reserve(self, order: TransferOrder, lease_s: float) -> Grant:
        agent = self._agent_of()
        self._remote = self._peers.remote_of(self._control, agent) if agent is not None else None
        if self._remote is not None and order.tier.medium not in self._remote.pools:
            self._remote = None  # that tier of the target is not registered (a GPU pool): tcp
        if self._remote is None:
            grant = self._fallback.reserve(order, lease_s)
            self.transport = self._fallback.transport
            return grant
        self._agent = agent
        grant = self._grant = self._control.reserve(order, lease_s, nixl=True)
        if grant.pages_token != self._remote.name:  # it restarted since its metadata was loaded
            self._control.abort(grant.handle, "the writer holds another agent's NIXL metadata")
            self._peers.forget(self._control.address, agent)  # type: ignore[arg-type]
            raise errors.Unavailable(f"target {self._control.address} restarted (new NIXL agent); retry the order")
        return grant

    def write_chunks(self, handle: str, chunks: Iterator[Chunk], total_bytes: int) -> int:
        if not self.active:
            return self._fallback.write_chunks(handle, chunks, total_bytes)
        # Never reached: with every local pool registered the source hands its pages to copy_pages.
        raise errors.FailedPrecondition(f"reservation {handle}: NIXL writes pages, not chunks")

    def copy_pages(self, handle: str, source: np.ndarray, source_pages: Sequence[int],
                   source_crcs: np.ndarray) -> None:
        """Writes the source pool's pages into the reservation's pages with
        NIXL (source_crcs: their segment checksums [pages, 2 * layers], folded
        into the per-block checksums Commit carries)."""
        grant, remote, agent = self._grant, self._remote, self._agent
        assert grant is not None and remote is not None and agent is not None and grant.handle == handle
        if remote.geometry.bytes_per_block != agent.geometry.bytes_per_block \
                or remote.geometry.segment_bytes != agent.geometry.segment_bytes:
            raise errors.FailedPrecondition(f"target {self._control.address}: geometry {remote.geometry} is not "
                                            f"this node's {agent.geometry}")
        target = remote.pools.get(grant.pages_medium)
        if target is None:
            raise errors.FailedPrecondition(f"target {self._control.address}: no {grant.pages_medium} pool in its "
                                            "NIXL metadata")
        block_bytes, segment_bytes = agent.geometry.bytes_per_block, agent.geometry.segment_bytes
        batches = write_batches(agent.region_of(source), target, source_pages, grant.pages,
                                max(1, self._batch_bytes // block_bytes))
        notes: list[bytes] = []
        if remote.batch_notes:
            crcs = batch_crcs(batches, source_crcs, block_bytes, segment_bytes)
            notes = notes_for(handle, batches, crcs, block_bytes)
        else:
            crcs = fold_block_crcs(source_crcs, segment_bytes, block_bytes)
        deadline = time.monotonic() + self._control.timeout_s + len(source_pages) * block_bytes / MIN_RATE_BYTES_S
        try:
            agent.write(remote.name, batches, deadline, self._pace, notes)
        except errors.Unavailable:
            self._peers.forget(self._control.address, agent)  # a dead target: load it afresh next time
            raise
        self._crcs, self._noted = crcs, bool(notes)

    def commit(self, handle: str, chunk_crcs: Mapping[int, int], replica_lease_s: float) -> int:
        if not self.active:
            return self._fallback.commit(handle, chunk_crcs, replica_lease_s)
        try:
            return self._control.commit(handle, self._crcs or chunk_crcs, replica_lease_s, shared_memory=True,
                                        nixl_batches=self._noted)
        except errors.Unavailable:
            self._peers.forget(self._control.address, self._agent)  # type: ignore[arg-type]
            raise

    def abort(self, handle: str, reason: str) -> None:
        (self._control if self.active else self._fallback).abort(handle, reason)

    def close(self) -> None:
        self._fallback.close()  # it shares the control channel and closes it

    def _pace(self, nbytes: int) -> None:
        if self._bucket is not None:
            wait = self._bucket.take(nbytes)
            if wait > 0:
                time.sleep(wait)
