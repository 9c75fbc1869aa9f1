"""What the connector's halves need from the node's kvstore, so that they
stay free of gRPC: kvstore_client.KVStoreClient is the real one, and
shared_client.SharedKVStore the same-host one. Every method fails open
(answers "nothing") rather than raising."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

import numpy as np


class KVStorePort(Protocol):
    def prefix_blocks(self, ids: Sequence[int]) -> int:
        """How many of ids, from the first, the kvstore holds; 0 on failure."""

    def get(self, ids: Sequence[int]) -> list[bytes] | None:
        """The blocks' canonical bytes in order, checked; None on any failure."""

    def put(self, ids: Sequence[int], parents: Sequence[int | None], family: str, data: Sequence[bytes]) -> None:
        """Store the blocks; existing ids stay as they are."""

    def map_prefix(self, ids: Sequence[int]) -> "ReadLease | None":
        """Pins the longest prefix of ids the kvstore holds in shared memory
        and says where it lies (an empty lease: none held); None when the
        kvstore cannot (it shares nothing, or the call failed): then ask
        prefix_blocks."""

    def release(self, lease: "ReadLease") -> None:
        """Ends a lease's pins (its lapse would end them anyway)."""


class PeerPort(KVStorePort, Protocol):
    """Another node's kvstore, which pulls name (kvstore_client.KVStoreClient)."""

    def replicate_to(self, target_node: str, target_address: str, ids: Sequence[int], family: str,
                     order_id: str) -> bool:
        """Copies the blocks into the target's kvstore; whether all are there now."""


@dataclass(frozen=True, slots=True)
class PullTarget:
    """This node as a pull names it: its id and its kvstore's address (the
    one it registered: a protected peer sends nowhere else)."""

    node_id: str
    address: str


@dataclass(frozen=True, slots=True)
class ReadLease:
    """Blocks pinned for reading: ids[i] lies in page pages[i] of the pool
    media[i], an arena whose token is tokens[media[i]]; the pins hold until
    `until` (time.monotonic(), the same clock in every process of a host)."""

    ids: tuple[int, ...]
    pages: tuple[int, ...]
    media: tuple[str, ...]
    tokens: Mapping[str, str]
    until: float

    def by_medium(self, start: int = 0, count: int | None = None) -> dict[str, tuple[list[int], list[int]]]:
        """For ids[start:start+count]: per pool, the positions (from start)
        and their pages."""
        stop = len(self.ids) if count is None else start + count
        grouped: dict[str, tuple[list[int], list[int]]] = {}
        for position in range(start, stop):
            positions, pages = grouped.setdefault(self.media[position], ([], []))
            positions.append(position - start)
            pages.append(self.pages[position])
        return grouped


@dataclass(frozen=True, slots=True)
class WriteSlot:
    """A reservation to fill: positions (in the save's block list) of the
    blocks the kvstore lacks, and their pages in pool `medium`."""

    handle: str
    positions: tuple[int, ...]
    pages: tuple[int, ...]
    medium: str
    capability: bytes = b""  # the reservation's write capability and its secret (a protected kvstore)
    secret: bytes = b""


class MappedPoolSet(Protocol):
    """A kvstore's pools as mapped here (shm.mapped_pool.MappedPools)."""

    def pool(self, medium: str) -> np.ndarray:
        """The mapped pool [layers, 2, pages, block_size, heads, head_dim]."""


class SharedPort(Protocol):
    """The same-host path (shared_client.SharedKVStore): the kvstore's pools
    mapped here; every method fails open (None / False), counted."""

    def map_for_read(self, ids: Sequence[int]) -> ReadLease | None:
        """Pins the blocks under a lease and says where they lie."""

    def pools_for(self, lease: ReadLease) -> "MappedPoolSet | None":
        """The mapped pools the lease's pages lie in, taken once (a copy reads
        this object even if another thread maps the pools again); None after
        a kvstore restart: the pools are then mapped again for the next call."""

    def release(self, lease: ReadLease) -> None:
        """Ends the pins (the lease would end them anyway)."""

    def reserve(self, ids: Sequence[int], parent: int | None, family: str) -> WriteSlot | None:
        """Pages for the blocks of ids the kvstore lacks (chained after parent)."""

    def commit(self, slot: WriteSlot) -> bool:
        """Publishes a filled reservation, checked against its pages."""

    def pool(self, medium: str) -> np.ndarray:
        """The mapped pool [layers, 2, pages, block_size, heads, head_dim]."""
