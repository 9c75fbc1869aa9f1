"""What the connector's halves need from the node's kvstore, so that they
stay free of gRPC: kvstore_client.KVStoreClient is the real one. Every
method fails open (answers "nothing") rather than raising."""
from __future__ import annotations

from typing import Protocol, Sequence


class KVStorePort(Protocol):
    def prefix_blocks(self, ids: Sequence[int]) -> int:
        """How many of ids, from the first, the kvstore holds; 0 on failure."""

    def get(self, ids: Sequence[int]) -> list[bytes] | None:
        """The blocks' canonical bytes in order, checked; None on any failure."""

    def put(self, ids: Sequence[int], parents: Sequence[int | None], family: str, data: Sequence[bytes]) -> None:
        """Store the blocks; existing ids stay as they are."""
