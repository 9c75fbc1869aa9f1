"""A host-memory pool backend whose pool lives in a SharedArena, so a
same-host peer can map the pages (arena.py). Everything else is NumpyBackend:
staging buffers stay private, pack/unpack are the NumPy reference.

One backend per pool: `arena` is the arena of the pool it allocated (zeros
is called once, by PagePool).
"""
from __future__ import annotations

import numpy as np

from speckv.kernels.backend import NumpyBackend
from speckv.services.kvstore.shm.arena import ArenaAddress, SharedArena


class SharedMemoryBackend(NumpyBackend):
    name = "numpy-shared"

    def __init__(self, label: str) -> None:
        super().__init__(pinned=False)
        self._label = label
        self.arena: SharedArena | None = None

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A zeroed array over a new arena (memfd pages read as zeros)."""
        if self.arena is not None:
            raise RuntimeError("SharedMemoryBackend allocates one pool; make one backend per pool")
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        self.arena = SharedArena(max(1, count * dtype.itemsize), self._label)
        return self.arena.array()[: count * dtype.itemsize].view(dtype).reshape(shape)


def arena_of(backend: object) -> ArenaAddress | None:
    """The shared arena a pool's backend put it in; None for private memory."""
    arena = getattr(backend, "arena", None)
    return arena.address if isinstance(arena, SharedArena) else None
