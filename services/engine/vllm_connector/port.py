"""What the connector's halves need from the node's kvstore, so that they
stay free of gRPC: kvstore_client.KVStoreClient is the real one, and
shared_client.SharedKVStore the same-host one. Every method fails open
(answers "nothing") rather than raising."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np


class KVStorePort(Protocol):
    def prefix_blocks(self, ids: Sequence[int]) -> int:
        """How many of ids, from the first, the kvstore holds; 0 on failure."""

    def get(self, ids: Sequence[int]) -> list[bytes] | None:
        """The blocks' canonical bytes in order, checked; None on any failure."""

    def put(self, ids: Sequence[int], parents: Sequence[int | None], family: str, data: Sequence[bytes]) -> None:
        """Store the blocks; existing ids stay as they are."""


@dataclass(frozen=True, slots=True)
class ReadLease:
    """Blocks pinned for reading: per pool (medium), the positions in the
    request and their pages; valid until `until` (time.monotonic())."""

    ids: tuple[int, ...]
    by_medium: dict[str, tuple[list[int], list[int]]]  # medium -> (positions, pool pages)
    until: float


@dataclass(frozen=True, slots=True)
class WriteSlot:
    """A reservation to fill: positions (in the save's block list) of the
    blocks the kvstore lacks, and their pages in pool `medium`."""

    handle: str
    positions: tuple[int, ...]
    pages: tuple[int, ...]
    medium: str


class SharedPort(Protocol):
    """The same-host path (shared_client.SharedKVStore): the kvstore's pools
    mapped here; every method fails open (None / False), counted."""

    def map_for_read(self, ids: Sequence[int]) -> ReadLease | None:
        """Pins the blocks under a lease and says where they lie."""

    def release(self, lease: ReadLease) -> None:
        """Ends the pins (the lease would end them anyway)."""

    def reserve(self, ids: Sequence[int], parent: int | None, family: str) -> WriteSlot | None:
        """Pages for the blocks of ids the kvstore lacks (chained after parent)."""

    def commit(self, slot: WriteSlot) -> bool:
        """Publishes a filled reservation, checked against its pages."""

    def pool(self, medium: str) -> np.ndarray:
        """The mapped pool [layers, 2, pages, block_size, heads, head_dim]."""
