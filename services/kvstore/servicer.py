"""gRPC face of the kvstore: unpack, check the wire limits (RequestLimits),
call the core, pack. No other logic here.

PutBlocks checks each message as it arrives (count, block size, family), so
a bad stream is refused at its first bad message instead of being buffered
whole first.

With a WriteGate (data_plane_auth on) Reserve answers a write capability
and WriteChunks, Commit and Abort need it (checked before the store is
asked anything, so a refused call changes nothing). Over TLS, a node's
Reserve is for itself as the source: the capability names the node its
certificate proves, and only that node (or the admin) may then write,
commit or abort with it.

Shared memory (OpenSharedPools, MapBlocks, Reserve and Commit with
shared_memory): store_shared.py; who may map the pools: shm/arena.py.

NIXL (NixlMetadata, Reserve with nixl, then Commit with shared_memory and
nixl_batches): nixl/agent.py, each batch checked as it lands by
nixl/landing.py; the metadata goes only to a node or the admin over TLS, and
the grant names only the reservation's pages (docs/dataplane.md says what
that bounds and what it does not)."""
from __future__ import annotations

import hmac

import threading
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Mapping

import grpc

from speckv.services.common.rpc import authz
from speckv.services.common.capability import Capability
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from speckv.services.common.rpc.geometry_proto import geometry_to_proto
from speckv.services.common.ids import BlockHash
from speckv.services.common.tiers import Tier
from speckv.services.common.rpc.tls import ADMIN, Identity, Role, peer_identity
from speckv.services.kvstore import validate
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.events import KVEvent
from speckv.services.kvstore.nixl.agent import NixlAgent
from speckv.services.kvstore.nixl.landing import NixlLanding
from speckv.services.kvstore.replication import ReplicationResult, Replicator, TransferOrder, TransferOutcome
from speckv.services.kvstore.records import BlockWrite, StoreStats
from speckv.services.kvstore.shm.arena import HostIdentity
from speckv.services.kvstore.store import KVStoreCore
from speckv.services.kvstore.write_gate import WriteGate
from speckv.v1 import common_pb2, kvstore_pb2, kvstore_pb2_grpc

MS = 1000.0


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may ask (KVStoreConfig's fields of the same names).
    Seconds and characters."""

    max_reservation_lease_s: float = 60.0
    pin_lease_s: float = 120.0
    max_family_chars: int = 256


class KVStoreServicer(kvstore_pb2_grpc.KVStoreServicer):
    def __init__(self, store: KVStoreCore, replicator: Replicator, stopping: threading.Event,
                 default_reservation_lease_s: float, data_address: str = "",
                 limits: RequestLimits = RequestLimits(), gate: WriteGate | None = None,
                 nixl: Callable[[], NixlAgent | None] = lambda: None,
                 order_counters: Callable[[], Mapping[str, int]] = dict,
                 landing: Callable[[], NixlLanding | None] = lambda: None) -> None:
        """nixl: this kvstore's NIXL agent once started (None: none); landing: its landing thread
        (each NIXL batch checked as it lands); order_counters: the scheduler agent's
        (StatsResponse.order_counters; empty without one)."""
        self._store = store
        self._order_counters = order_counters
        self._nixl = nixl
        self._landing = landing
        self._gate = gate
        self._data_address = data_address
        self._replicator = replicator
        self._stopping = stopping
        self._default_lease_s = default_reservation_lease_s
        self._limits = limits
        # The store refuses a put of more blocks than the device tier has pages: refuse them as they come.
        self._max_put_blocks = min(store.max_hashes, store.stats().num_pages)

    def Lookup(self, request: kvstore_pb2.LookupRequest, context: grpc.ServicerContext) -> kvstore_pb2.LookupResponse:
        result = self._store.lookup(list(request.block_hashes))
        return kvstore_pb2.LookupResponse(present=result.present, prefix_blocks=result.prefix_blocks)

    def PutBlocks(self, request_iterator: Iterator[kvstore_pb2.PutBlockRequest],
                  context: grpc.ServicerContext) -> kvstore_pb2.PutBlocksResponse:
        authz.require_engine_or_admin(context, self._store.node_id, "PutBlocks")
        blocks: list[BlockWrite] = []
        bytes_per_block, max_family = self._store.bytes_per_block, self._limits.max_family_chars
        for message in request_iterator:
            i = len(blocks)
            if i >= self._max_put_blocks:
                raise InvalidArgument(f"put_blocks: more than {self._max_put_blocks} blocks in one stream")
            validate.block_size(len(message.data), bytes_per_block, i, message.block_hash)
            validate.family(message.family, f"put_blocks: block {i}'s family", max_family)
            blocks.append(BlockWrite(BlockHash(message.block_hash), message.data, message.family,
                                     BlockHash(message.parent_hash) if message.has_parent else None))
        result = self._store.put_blocks(blocks)
        return kvstore_pb2.PutBlocksResponse(stored=result.stored, already_present=result.already_present,
                                             evicted=result.evicted)

    def GetBlocks(self, request: kvstore_pb2.GetBlocksRequest,
                  context: grpc.ServicerContext) -> Iterator[kvstore_pb2.BlockData]:
        authz.require_engine_or_admin(context, self._store.node_id, "GetBlocks")
        blocks = self._store.get_blocks(list(request.block_hashes))
        try:
            for block_hash, buffer in blocks:
                data = buffer.tobytes()  # protobuf needs bytes
                yield kvstore_pb2.BlockData(block_hash=block_hash, data=data, crc32c=crc32c(data))
        finally:
            blocks.close()  # drops the read pins even when the client goes away

    def Pin(self, request: kvstore_pb2.PinRequest, context: grpc.ServicerContext) -> kvstore_pb2.PinResponse:
        return kvstore_pb2.PinResponse(changed=self._store.pin(list(request.block_hashes), self._limits.pin_lease_s))

    def Unpin(self, request: kvstore_pb2.PinRequest, context: grpc.ServicerContext) -> kvstore_pb2.PinResponse:
        return kvstore_pb2.PinResponse(changed=self._store.unpin(list(request.block_hashes)))

    def Promote(self, request: kvstore_pb2.PromoteRequest,
                context: grpc.ServicerContext) -> kvstore_pb2.PromoteResponse:
        return kvstore_pb2.PromoteResponse(promoted=self._store.promote(list(request.block_hashes)))

    def GetStats(self, request: kvstore_pb2.StatsRequest, context: grpc.ServicerContext) -> kvstore_pb2.StatsResponse:
        reply = stats_to_proto(self._store.stats())
        reply.order_counters.update(self._order_counters())
        return reply

    def SubscribeEvents(self, request: kvstore_pb2.SubscribeEventsRequest,
                        context: grpc.ServicerContext) -> Iterator[kvstore_pb2.KVEvent]:
        def keep_going() -> bool:
            return context.is_active() and not self._stopping.is_set()

        for event in self._store.subscribe(request.after_sequence, keep_going):
            yield event_to_proto(event)

    def Replicate(self, request: kvstore_pb2.ReplicateRequest,
                  context: grpc.ServicerContext) -> kvstore_pb2.ReplicateResponse:
        # An operator's call (the scheduler's orders reach the agent over WatchOrders, never here), or a
        # pull: the target node's engine asking for a copy into its own kvstore (the connector's
        # kv_transfer_params). A pull goes only to the target's registered address, so it needs the
        # registry check (data_plane_auth) that an operator's call may go without, and it is only a pull:
        # the copy lands as the target's own blocks, with no replica lease.
        if not authz.require_admin_or_target_engine(context, request.order.target_node, "Replicate"):
            if not request.pull:
                raise PermissionDenied("an engine may only pull (ReplicateRequest.pull); replicas are the "
                                       "scheduler's orders")
            if request.order.lease_ms:
                raise PermissionDenied("a pull's copy is the node's own KV: it carries no replica lease (lease_ms 0)")
            if request.order.source_node not in ("", self._store.node_id):
                raise PermissionDenied(f"a pull names source node {request.order.source_node!r}; "
                                       f"this is {self._store.node_id!r}")
            if not self._replicator.checks_targets:
                raise PermissionDenied("a pull needs data_plane_auth on this kvstore (so that the target's "
                                       "address is checked against the registry); only the admin may replicate")
        validate.family(request.order.family, "replicate: order.family", self._limits.max_family_chars)
        order = replace(order_from_proto(request.order), pull=request.pull)
        result = self._replicator.replicate(order, chunk_bytes=request.chunk_bytes,
                                            transport=request.transport)
        if result.error is not None:
            raise result.error  # the error interceptor maps it to its status
        return result_to_proto(result)

    def Reserve(self, request: kvstore_pb2.ReserveRequest,
                context: grpc.ServicerContext) -> kvstore_pb2.ReserveResponse:
        lease_s = request.lease_ms / MS if request.lease_ms else self._default_lease_s
        if lease_s > self._limits.max_reservation_lease_s:
            raise InvalidArgument(f"reserve: lease_ms={request.lease_ms}: at most "
                                  f"{self._limits.max_reservation_lease_s * MS:g} ms (max_reservation_lease_s)")
        validate.family(request.family, "reserve: family", self._limits.max_family_chars)
        if request.engine_save:
            authz.require_engine_or_admin(context, self._store.node_id, "Reserve with engine_save")
        source = _source_node(context, request.source_node, self._store.node_id) if self._gate is not None \
            else request.source_node
        grant = self._store.reserve(
            request.order_id, list(request.block_hashes), lease_s, family=request.family,
            parent=BlockHash(request.parent_hash) if request.has_parent else None, source_node=source,
            # A pull's copy, like an engine's save, is the node's own KV: published STORED, not COMMITTED.
            tier=Tier.parse(request.medium), engine_save=request.engine_save or request.pull)
        capability = self._gate.mint(grant, request.order_id, source) if self._gate is not None else b""
        reply = kvstore_pb2.ReserveResponse(handle=grant.handle, block_hashes=grant.hashes,
                                            bytes_per_block=grant.bytes_per_block, lease_deadline_s=grant.deadline_s,
                                            data_address=self._data_address, capability=capability,
                                            capability_secret=self._gate.secret(capability) if capability else b"")
        if request.shared_memory:
            try:
                tier, pages = self._store.reservation_pages(grant.handle)
            except FailedPrecondition:
                self._store.abort(grant.handle, "the writer asked for shared memory this tier lacks")
                raise
            reply.pages.extend(pages)
            reply.pages_medium = tier.medium
            reply.pages_token = self._store.shared_arenas()[tier].token
        elif request.nixl:
            self._nixl_pages(grant.handle, reply)
            landing = self._landing()
            if landing is not None:
                landing.expect(grant.handle, lease_s)
        return reply

    def _nixl_pages(self, handle: str, reply: kvstore_pb2.ReserveResponse) -> None:
        """Names the reservation's pages and the agent their pool is
        registered with; aborts the reservation when there is none."""
        agent = self._nixl()
        try:
            if agent is None:
                raise FailedPrecondition("reserve with nixl: this kvstore has no NIXL agent")
            tier, pages = self._store.reservation_pages(handle, shared=False)
            if tier.medium not in agent.regions:
                raise FailedPrecondition(f"reserve with nixl: the {tier.medium} pool is not registered with NIXL")
        except FailedPrecondition:
            self._store.abort(handle, "the writer asked for NIXL this tier lacks")
            raise
        reply.pages.extend(pages)
        reply.pages_medium = tier.medium
        reply.pages_token = agent.name

    def NixlMetadata(self, request: kvstore_pb2.NixlMetadataRequest,
                     context: grpc.ServicerContext) -> kvstore_pb2.NixlMetadataResponse:
        # The metadata holds the remote keys of every registered pool: over TLS only a node or the admin gets it.
        caller = peer_identity(context)
        if caller is not None and caller != ADMIN and caller.role is not Role.NODE:
            raise PermissionDenied(f"NixlMetadata: {caller} may not; only a node or the admin may")
        agent = self._nixl()
        if agent is None:
            raise FailedPrecondition("NixlMetadata: this kvstore has no NIXL agent (NIXL not installed, or --no-nixl)")
        return kvstore_pb2.NixlMetadataResponse(
            agent_name=agent.name, metadata=agent.metadata(), geometry=geometry_to_proto(self._store.geometry),
            pools=[kvstore_pb2.NixlPool(medium=medium, address=r.address, size=r.size, num_pages=r.num_pages)
                   for medium, r in agent.regions.items()], batch_notes=self._landing() is not None)

    def WriteChunks(self, request_iterator: Iterator[kvstore_pb2.WriteChunkRequest],
                    context: grpc.ServicerContext) -> kvstore_pb2.WriteChunksResponse:
        handle, received = "", 0
        capability: Capability | None = None
        for message in request_iterator:
            if handle and message.handle != handle:
                raise InvalidArgument(f"write_chunks: one stream writes one reservation ({handle!r}, "
                                      f"then {message.handle!r})")
            handle = message.handle
            if self._gate is not None:  # the MAC once per stream; range and expiry per chunk
                if capability is None:
                    capability = self._writer(context, message.capability, handle, message.capability_secret)
                self._gate.still_covers(capability, handle, message.offset, len(message.data))
            received = self._store.write_chunk(message.handle, message.offset, message.data, message.crc32c)
        return kvstore_pb2.WriteChunksResponse(bytes_received=received)

    def Commit(self, request: kvstore_pb2.CommitRequest, context: grpc.ServicerContext) -> kvstore_pb2.CommitResponse:
        self._writer(context, request.capability, request.handle, request.capability_secret)
        landing = self._landing() if request.nixl_batches else None
        if landing is not None:  # each batch was checked as it landed: wait for the last ones
            landing.settle(request.handle, request.chunk_crc32c.keys())
        if request.shared_memory:
            committed = self._store.commit_shared(request.handle, dict(request.chunk_crc32c),
                                                  request.replica_lease_ms / MS, list(request.segment_crc32c),
                                                  landed=request.nixl_batches)
        else:
            committed = self._store.commit(request.handle, dict(request.chunk_crc32c), request.replica_lease_ms / MS)
        return kvstore_pb2.CommitResponse(blocks_committed=committed)

    def OpenSharedPools(self, request: kvstore_pb2.OpenSharedPoolsRequest,
                        context: grpc.ServicerContext) -> kvstore_pb2.OpenSharedPoolsResponse:
        # Naming the arenas grants nothing: only a process the OS lets read this one's /proc/<pid>/fd can map them.
        arenas = self._store.shared_arenas()
        bytes_per_block = self._store.bytes_per_block
        host = HostIdentity.here()
        return kvstore_pb2.OpenSharedPoolsResponse(
            pools=[kvstore_pb2.SharedPool(medium=tier.medium, pid=a.pid, fd=a.fd, size=a.size, token=a.token,
                                          num_pages=a.size // bytes_per_block) for tier, a in arenas.items()],
            geometry=geometry_to_proto(self._store.geometry), boot_id=host.boot_id, pid_namespace=host.pid_namespace)

    def MapBlocks(self, request: kvstore_pb2.MapBlocksRequest,
                  context: grpc.ServicerContext) -> kvstore_pb2.MapBlocksResponse:
        authz.require_engine_or_admin(context, self._store.node_id, "MapBlocks")
        lease_s = request.lease_ms / MS
        if not 0 < lease_s <= self._limits.pin_lease_s:
            raise InvalidArgument(f"map_blocks: lease_ms={request.lease_ms}: must be in (0, "
                                  f"{self._limits.pin_lease_s * MS:g}] (pin_lease_s)")
        places = self._store.map_blocks(list(request.block_hashes), lease_s, prefix=request.prefix)
        arenas = self._store.shared_arenas()
        return kvstore_pb2.MapBlocksResponse(
            pages=[p.page for p in places], media=[p.tier.medium for p in places], lease_s=lease_s,
            pool_tokens={t.medium: arenas[t].token for t in {p.tier for p in places}})

    def Abort(self, request: kvstore_pb2.AbortRequest, context: grpc.ServicerContext) -> kvstore_pb2.AbortResponse:
        self._writer(context, request.capability, request.handle, request.capability_secret)
        freed = self._store.abort(request.handle, request.reason)
        landing = self._landing()
        if landing is not None:
            landing.forget(request.handle)
        return kvstore_pb2.AbortResponse(pages_freed=freed)


    def _writer(self, context: grpc.ServicerContext, token: bytes, handle: str, secret: bytes) -> Capability | None:
        """The caller's capability for handle (None without a gate): it must
        verify, come with its secret (the proof of possession on gRPC, where
        the channel is the control plane's: issue 43), and over TLS the
        caller must be its source node or the admin."""
        if self._gate is None:
            return None
        capability = self._gate.check(token, handle)
        if not hmac.compare_digest(self._gate.secret(token), secret):
            raise PermissionDenied(f"reservation {handle}: the capability came without its secret "
                                   "(ReserveResponse.capability_secret)")
        caller = peer_identity(context)
        writers = [ADMIN, Identity(Role.NODE, capability.source_node)]
        if capability.source_node == self._store.node_id:  # this node's engine writing into it (its saves)
            writers.append(Identity(Role.ENGINE, capability.source_node))
        if caller is not None and caller not in writers:
            raise PermissionDenied(f"reservation {handle}: {caller} may not write it; its capability is for "
                                   f"source node {capability.source_node!r}")
        return capability


def _source_node(context: grpc.ServicerContext, asked: str, own_node: str) -> str:
    """The source a Reserve is for: over TLS a node reserves as itself (the
    node its certificate proves), a node's engine as that node (on it only);
    the admin, or any caller without TLS, as asked."""
    caller = peer_identity(context)
    if caller is not None and caller.role is Role.ENGINE:
        # An engine writes into its own node only (its connector's saves), as that node.
        if caller.name != own_node:
            raise PermissionDenied(f"reserve on node {own_node!r}: {caller} is another node's engine")
        return own_node
    if caller is None or caller.role is not Role.NODE:
        return asked
    if asked and asked != caller.name:
        raise PermissionDenied(f"reserve for source node {asked!r}: {caller} may reserve only as itself")
    return caller.name


def order_from_proto(message: common_pb2.ReplicationOrder) -> TransferOrder:
    return TransferOrder(
        order_id=message.order_id, block_hashes=tuple(BlockHash(h) for h in message.block_hashes),
        target_address=message.target_address, family=message.family, source_node=message.source_node,
        target_node=message.target_node, replica_lease_s=message.lease_ms / MS,
        tier=Tier.parse(message.target_medium))


def result_to_proto(result: ReplicationResult) -> kvstore_pb2.ReplicateResponse:
    state = (common_pb2.ORDER_STATE_COMMITTED if result.outcome is TransferOutcome.COMMITTED
             else common_pb2.ORDER_STATE_FAILED)
    return kvstore_pb2.ReplicateResponse(
        order_id=result.order_id, state=state, blocks_sent=result.blocks_sent,
        blocks_skipped=result.blocks_skipped, bytes_sent=result.bytes_sent, seconds=result.seconds,
        message=result.message, transport=result.transport)


def stats_to_proto(stats: StoreStats) -> kvstore_pb2.StatsResponse:
    reply = kvstore_pb2.StatsResponse(
        node_id=stats.node_id, geometry=geometry_to_proto(stats.geometry), num_pages=stats.num_pages,
        used_pages=stats.used_pages, free_pages=stats.free_pages, pinned_pages=stats.pinned_pages,
        reserved_pages=stats.reserved_pages, replica_pages=stats.replica_pages, pool_bytes=stats.pool_bytes,
        last_event_sequence=stats.last_event_sequence, blocks_stored_total=stats.blocks_stored_total,
        blocks_evicted_total=stats.blocks_evicted_total, blocks_committed_total=stats.blocks_committed_total,
        blocks_demoted_total=stats.blocks_demoted_total, blocks_promoted_total=stats.blocks_promoted_total,
        blocks_dropped_total=stats.blocks_dropped_total, retained_blocks=stats.retained_blocks,
        retain_max_blocks=stats.retain_max_blocks)
    host = stats.host
    if host is not None:
        reply.host_pages, reply.host_used_pages, reply.host_free_pages = host.num_pages, host.used_pages, host.free_pages
        reply.host_pinned_pages, reply.host_replica_pages = host.pinned_pages, host.replica_pages
        reply.host_pool_bytes = host.pool_bytes
    disk = stats.disk
    if disk is not None:
        reply.disk_pages, reply.disk_used_pages, reply.disk_free_pages = disk.num_pages, disk.used_pages, disk.free_pages
        reply.disk_pool_bytes = disk.pool_bytes
        reply.disk_counters.update(stats.disk_counters)
    return reply


def event_to_proto(event: KVEvent) -> kvstore_pb2.KVEvent:
    return kvstore_pb2.KVEvent(
        sequence=event.sequence, type=int(event.type), block_hashes=event.block_hashes,
        parent_hash=event.parent or 0, has_parent=event.parent is not None, block_size=event.block_size,
        family=event.family, node_id=event.node_id, time_s=event.time_s, order_id=event.order_id,
        medium=event.medium, host_block_hashes=event.host_block_hashes, disk_block_hashes=event.disk_block_hashes)
