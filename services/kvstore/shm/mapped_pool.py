"""A same-host kvstore's pools mapped into this process (arena.py), seen as
its layer-major arrays, and the canonical checksums of blocks written into
them. Used by both same-host writers and readers: the vLLM connector
(services/engine/vllm_connector) and a kvstore replicating to a peer on its
own host (../shm_target.py); one mechanism, built once.

    pool[medium]: [num_layers][2][num_pages][block_size][num_kv_heads][head_dim]

of the geometry's storage dtype (bfloat16 as uint16, geometry.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speckv.services.common.errors import FailedPrecondition
from speckv.services.common.geometry import KVGeometry
from speckv.services.kvstore.checksum import combine, crc32c
from speckv.services.kvstore.shm.arena import ArenaAddress, MappedArena


@dataclass(frozen=True, slots=True)
class SharedPoolInfo:
    """One pool a kvstore shares (its OpenSharedPools answer)."""

    medium: str
    address: ArenaAddress
    num_pages: int


class MappedPools:
    """Every shared pool of one kvstore, mapped. FailedPrecondition when
    one cannot be (another host, another user, a stale address)."""

    def __init__(self, pools: Sequence[SharedPoolInfo], geometry: KVGeometry) -> None:
        self.geometry = geometry
        self._arenas: list[MappedArena] = []
        self.pools: dict[str, np.ndarray] = {}
        g = geometry
        try:
            for info in pools:
                if info.address.size != info.num_pages * g.bytes_per_block:
                    raise FailedPrecondition(f"shared pool {info.medium}: {info.address.size} bytes is not "
                                             f"{info.num_pages} pages of {g.bytes_per_block}")
                arena = MappedArena(info.address, info.medium)
                self._arenas.append(arena)
                shape = (g.num_layers, 2, info.num_pages, g.block_size, g.num_kv_heads, g.head_dim)
                self.pools[info.medium] = arena.array().view(g.storage_dtype).reshape(shape)
        except BaseException:
            self.close()
            raise

    def token(self, medium: str) -> str:
        """The token of the arena mapped for medium ("" if none): a kvstore's
        reply naming another token speaks of arenas this mapping is not."""
        return next((a.address.token for a in self._arenas if a.medium == medium), "")

    def pool(self, medium: str) -> np.ndarray:
        try:
            return self.pools[medium]
        except KeyError:
            raise FailedPrecondition(f"the kvstore shares no {medium!r} pool (shares {sorted(self.pools)})") from None

    def flat(self, medium: str) -> np.ndarray:
        """The pool as flat bytes (segment offsets: services/kvstore/segments.py)."""
        return self.pool(medium).reshape(-1).view(np.uint8)

    def blocks_crcs(self, medium: str, pages: Sequence[int]) -> dict[int, int]:
        """chunk_crc32c for a shared-memory Commit: one chunk per block, keyed
        by its byte offset in the reservation, read from the mapping."""
        pool = self.pool(medium)
        segments = np.array([[crc32c(pool[layer, kv, page]) for layer in range(pool.shape[0]) for kv in range(2)]
                             for page in pages], dtype=np.uint32).reshape(len(pages), 2 * pool.shape[0])
        return fold_block_crcs(segments, self.geometry.segment_bytes, self.geometry.bytes_per_block)

    def close(self) -> None:
        self.pools.clear()
        for arena in self._arenas:
            arena.close()
        self._arenas.clear()


def fold_block_crcs(segment_crcs: np.ndarray, segment_bytes: int, block_bytes: int) -> dict[int, int]:
    """Per-block chunk checksums (offset -> crc32c of the block's canonical
    bytes) folded from its segments' ([blocks, 2 * layers], (layer, K/V)
    order), without reading the bytes again."""
    out = {}
    for i, row in enumerate(segment_crcs.tolist()):
        crc = 0
        for part in row:
            crc = combine(crc, part, segment_bytes)
        out[i * block_bytes] = crc
    return out
