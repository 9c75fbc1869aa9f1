"""Stand-ins for the connector's unit tests: a small KV layout and a dict kvstore (a port.KVStorePort)."""
from __future__ import annotations

from speckv.services.engine.vllm_connector.identity import KVLayout

LAYOUT = KVLayout(model="m", dtype="float32", block_size=32, num_layers=2, num_kv_heads=2, head_dim=16,
                  tp_rank=0, page_layout="cpu:H,2,N,C", hash_algo="sha256")


class FakeStore:
    """A dict kvstore; get fails for ids in `broken`."""

    def __init__(self) -> None:
        self.blocks: dict[int, bytes] = {}
        self.broken: set[int] = set()

    def prefix_blocks(self, ids):
        n = 0
        while n < len(ids) and ids[n] in self.blocks:
            n += 1
        return n

    def get(self, ids):
        if any(i in self.broken or i not in self.blocks for i in ids):
            return None
        return [self.blocks[i] for i in ids]

    def put(self, ids, parents, family, data):
        for i, d in zip(ids, data):
            self.blocks.setdefault(i, d)
