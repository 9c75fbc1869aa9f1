"""Source half of the replication handshake: execute one order.

  1. pin the order's blocks locally (FAILED_PRECONDITION naming any missing);
  2. target.reserve -> handle + the hashes the target lacks;
  3. stream the blocks' canonical bytes as chunks of at most chunk_bytes.
     Zero-copy when the pool is in host memory and the transport can send
     from views (the TCP data plane): chunk i is bytes [i * chunk_bytes, ...)
     of the transfer, handed over as memoryviews of the pinned pages'
     segments (sendmsg gathers them) with its crc32c folded from the
     segments' cached checksums, so no byte is copied or re-read here.
     Otherwise packed: blocks are packed group by group (gather kernel) into
     two alternating staging buffers; chunks never straddle a group, a group
     is max(1, chunk_bytes // bytes_per_block) blocks; packing runs on its
     own thread (pack_pipeline.py), so the transport sends chunk i while
     chunk i+1 is packed;
  4. target.commit with the crc32c of every chunk, keyed by offset;
  any failure after the reserve -> target.abort (best effort), order FAILED.

With data_plane_auth on (a RegisteredPeers given), step 1 is preceded by a
check that the target is a registered node's registered address, and the
data address the target answers must be on that node's host (peers.py):
a refused target is never connected to. The order's source_node defaults
to this node (it is what the target's write capability names).

The transport sits behind ReplicationTarget: the bulk TCP data plane
(tcp_target.py), the gRPC WriteChunks fallback (grpc_target.py), a core in
the same process (local_target.py), or shared memory with a kvstore on the
same host (shm_target.py). A target that copies pages itself (copies_pages:
shared memory) is handed the pinned source pool and pages with their
segment checksums instead of chunks: it copies run by run, so step 3 is
one memcpy per (layer, K/V) and run of consecutive pages. An order may name the transport and the
chunk size; otherwise the node's defaults apply.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Iterator, Mapping, Protocol, Sequence

from speckv.services.common.clock import Clock
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, SpeckvError
from speckv.services.common.ids import BlockHash
from speckv.services.common.tiers import Tier
from speckv.services.kvstore import validate
from speckv.services.kvstore.pack_pipeline import pipelined_chunks
from speckv.services.kvstore.peers import RegisteredPeers
from speckv.services.kvstore.pool import Buffer, PageId
from speckv.services.kvstore.reservations import Grant
from speckv.services.kvstore.store import KVStoreCore

log = logging.getLogger(__name__)
KIB = 1024
MIN_CHUNK, MAX_CHUNK = 256 * KIB, 4096 * KIB


@dataclass(frozen=True, slots=True)
class TransferOrder:
    """A replication order as the kvstore needs it (times in seconds)."""

    order_id: str
    block_hashes: tuple[BlockHash, ...]
    target_address: str
    family: str = ""
    source_node: str = ""
    target_node: str = ""
    replica_lease_s: float = 0.0  # 0: the copies are ordinary blocks
    parent: BlockHash | None = None
    tier: Tier = Tier.DEVICE  # where the target keeps the copies
    pull: bool = False  # the target asked for it: the copies land as its own blocks (STORED), not replicas


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes for offset..offset+nbytes of a reservation. data is a view of a
    staging buffer, valid until the transport asks for the next chunk (a
    transport that must keep it, like gRPC, copies it to bytes). A zero-copy
    chunk (only for a target whose zero_copy is True) has data None and its
    bytes in `pieces`, memoryviews of the source pool, in order."""

    offset: int
    data: Buffer | None
    crc32c: int
    pieces: tuple[memoryview, ...] = ()

    @property
    def nbytes(self) -> int:
        if self.data is None:
            return sum(len(p) for p in self.pieces)
        return self.data.nbytes if hasattr(self.data, "nbytes") else len(self.data)  # type: ignore[union-attr]


class ReplicationTarget(Protocol):
    """The target kvstore as seen by the source; one instance per order."""

    transport: str  # the data plane the chunks went over ("tcp", "grpc", "local")
    zero_copy: bool  # after reserve: whether write_chunks takes zero-copy chunks (pieces)

    def reserve(self, order: TransferOrder, lease_s: float) -> Grant: ...

    def write_chunks(self, handle: str, chunks: Iterator[Chunk], total_bytes: int) -> int:
        """Sends every chunk; returns the bytes the target acknowledged."""
        ...

    def commit(self, handle: str, chunk_crcs: Mapping[int, int], replica_lease_s: float) -> int: ...

    def abort(self, handle: str, reason: str) -> None: ...

    def close(self) -> None: ...


TargetFactory = Callable[[str], ReplicationTarget]  # target address -> transport


class TransferOutcome(Enum):
    COMMITTED = "committed"
    FAILED = "failed"


@dataclass(slots=True)
class ReplicationResult:
    order_id: str
    outcome: TransferOutcome
    blocks_sent: int = 0
    blocks_skipped: int = 0  # already on the target
    bytes_sent: int = 0
    seconds: float = 0.0
    message: str = ""
    transport: str = ""
    error: SpeckvError | None = None  # set when FAILED


class Replicator:
    def __init__(self, store: KVStoreCore, connect: TargetFactory, clock: Clock, *,
                 chunk_bytes: int = 1024 * KIB, reservation_lease_s: float = 10.0,
                 transports: Mapping[str, TargetFactory] | None = None,
                 peers: RegisteredPeers | None = None) -> None:
        """connect: the node's default transport; transports: the ones an order
        may ask for by name; peers: where replicas may go (None: anywhere, as
        without data_plane_auth)."""
        _check_chunk(chunk_bytes, "chunk_bytes")
        self._store = store
        self._connect = connect
        self._transports = dict(transports or {})
        self._clock = clock
        self._peers = peers
        self.chunk_bytes = chunk_bytes
        self.reservation_lease_s = reservation_lease_s
        # (transport, outcome) -> [copies, bytes sent], since start: what each data plane carried (metrics).
        self._carried: dict[tuple[str, str], list[int]] = {}
        self._carried_lock = threading.Lock()

    def carried(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(transport, outcome) -> (copies, bytes sent) since start; outcome is the TransferOutcome's value."""
        with self._carried_lock:
            return {key: (n, b) for key, (n, b) in self._carried.items()}

    @property
    def checks_targets(self) -> bool:
        """Whether every target is checked against the registry (data_plane_auth)."""
        return self._peers is not None

    def replicate(self, order: TransferOrder, *, chunk_bytes: int = 0, transport: str = "") -> ReplicationResult:
        """Runs the handshake. Input errors and missing source blocks raise;
        failures after that are returned as a FAILED result (with the error).
        chunk_bytes 0 and transport "" keep the node's defaults."""
        validate.identifier(order.order_id, "order.order_id")
        validate.identifier(order.target_address, "order.target_address")
        validate.hash_list(order.block_hashes, "order.block_hashes", self._store.max_hashes, unique=True)
        if order.replica_lease_s < 0:
            raise InvalidArgument(f"order.replica_lease_s={order.replica_lease_s}: must be >= 0")
        if chunk_bytes:
            _check_chunk(chunk_bytes, "chunk_bytes")
        if transport and transport not in self._transports:
            raise InvalidArgument(f"transport={transport!r}: expected one of {', '.join(self._transports) or '(none)'}")
        connect = self._transports[transport] if transport else self._connect
        chunk_bytes = chunk_bytes or self.chunk_bytes
        if self._peers is not None:
            self._peers.check(order.target_node, order.target_address)  # before any connection
        if not order.source_node:
            order = replace(order, source_node=self._store.node_id)
        started = self._clock.now()
        result = ReplicationResult(order.order_id, TransferOutcome.FAILED)
        with self._store.hold(order.block_hashes, f"replicate order {order.order_id}"):
            if order.parent is None and order.block_hashes:  # a run from mid-chain continues its chain there
                order = replace(order, parent=self._store.parent_of(order.block_hashes[0]))
            target = connect(order.target_address)
            try:
                self._run(order, target, result, chunk_bytes)
            except SpeckvError as exc:
                result.outcome, result.error, result.message = TransferOutcome.FAILED, exc, str(exc)
            finally:
                result.transport = target.transport
                target.close()
        result.seconds = self._clock.now() - started
        with self._carried_lock:
            tally = self._carried.setdefault((result.transport, result.outcome.value), [0, 0])
            tally[0] += 1
            tally[1] += result.bytes_sent
        return result

    def _run(self, order: TransferOrder, target: ReplicationTarget, result: ReplicationResult, chunk_bytes: int) -> None:
        grant = target.reserve(order, self.reservation_lease_s)
        try:
            self._check_grant(order, grant)
            result.blocks_skipped = len(order.block_hashes) - len(grant.hashes)
            crcs: dict[int, int] = {}
            total = len(grant.hashes) * grant.bytes_per_block
            if grant.hashes:
                placed = self._store.pages_of(grant.hashes) if target.zero_copy else None
                if placed is not None and getattr(target, "copies_pages", False) \
                        and self._store.tier_zero_copy(placed[0]):
                    source, segment_crcs = self._store.copy_source(*placed)
                    target.copy_pages(grant.handle, source, placed[1], segment_crcs)  # type: ignore[attr-defined]
                    result.bytes_sent += total
                    chunks = None
                elif placed is not None and self._store.tier_zero_copy(placed[0]):
                    chunks = self._views(placed[0], placed[1], chunk_bytes, crcs, result)
                else:
                    chunks = self._chunks(grant.hashes, chunk_bytes, crcs, result)
                if chunks is not None:
                    target.write_chunks(grant.handle, chunks, total)
            target.commit(grant.handle, crcs, order.replica_lease_s)
            result.blocks_sent = len(grant.hashes)
            result.outcome = TransferOutcome.COMMITTED
        except BaseException as exc:
            self._abort(target, grant.handle, exc)
            raise

    def _check_grant(self, order: TransferOrder, grant: Grant) -> None:
        if grant.bytes_per_block != self._store.bytes_per_block:
            raise FailedPrecondition(
                f"order {order.order_id}: target {order.target_address} has {grant.bytes_per_block} bytes "
                f"per block, this node {self._store.bytes_per_block}: different KV geometry")
        if self._peers is not None and grant.data_address:
            self._peers.check_data_address(order.target_address, grant.data_address)
        unknown = set(grant.hashes) - set(order.block_hashes)
        if unknown:
            raise FailedPrecondition(f"order {order.order_id}: target reserved hashes not in the order: "
                                     f"{validate.quote(sorted(unknown))}")

    def _chunks(self, hashes: Sequence[BlockHash], chunk_bytes: int, crcs: dict[int, int],
                result: ReplicationResult) -> Iterator[Chunk]:
        """Packs (on the pipeline's thread) and yields the chunks; records each
        crc and counts bytes."""
        for packed in pipelined_chunks(self._store.pack, hashes, self._store.bytes_per_block, chunk_bytes):
            crcs[packed.offset] = packed.crc32c
            result.bytes_sent += packed.data.nbytes
            yield Chunk(packed.offset, packed.data, packed.crc32c)

    def _views(self, tier: Tier, pages: Sequence[PageId], chunk_bytes: int, crcs: dict[int, int],
               result: ReplicationResult) -> Iterator[Chunk]:
        """Zero-copy chunks: views of the held pages (all in tier), crc32c
        from cached segment checksums; records each crc and counts bytes."""
        total = len(pages) * self._store.bytes_per_block
        for offset in range(0, total, chunk_bytes):
            size = min(chunk_bytes, total - offset)
            views, crc = self._store.source_chunk(pages, offset, size, tier)
            crcs[offset] = crc
            result.bytes_sent += size
            yield Chunk(offset, None, crc, tuple(views))

    @staticmethod
    def _abort(target: ReplicationTarget, handle: str, exc: BaseException) -> None:
        try:
            target.abort(handle, f"source gave up: {exc}")
        except Exception:  # noqa: BLE001 - the lease reaps it anyway
            log.warning("abort of reservation %s failed; its lease will reap it", handle, exc_info=True)


def _check_chunk(chunk_bytes: int, name: str) -> None:
    if not MIN_CHUNK <= chunk_bytes <= MAX_CHUNK:
        raise InvalidArgument(f"{name}={chunk_bytes}: must be {MIN_CHUNK}..{MAX_CHUNK}")
