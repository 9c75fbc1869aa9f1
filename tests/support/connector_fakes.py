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
        self.released: list = []

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

    def map_prefix(self, ids):
        return None  # nothing shared: the scheduler side asks prefix_blocks

    def release(self, lease):
        self.released.append(lease)


class FakePeer(FakeStore):
    """Another node's dict kvstore: replicate_to copies into `targets[node]`
    (whose ids it holds), or fails when `refuse` is set."""

    def __init__(self, targets: dict) -> None:
        super().__init__()
        self.targets = targets
        self.refuse = False
        self.orders: list = []

    def replicate_to(self, target_node, target_address, ids, family, order_id):
        self.orders.append((target_node, target_address, tuple(ids), family, order_id))
        if self.refuse or any(i not in self.blocks for i in ids) or target_node not in self.targets:
            return None
        held = self.targets[target_node].blocks
        copied = [i for i in ids if i not in held]
        for i in copied:
            held[i] = self.blocks[i]
        return len(copied)


class CoreShared:
    """A port.SharedPort over a real KVStoreCore in this process, its pools in
    shared memory and mapped a second time as the connector maps them (what
    shared_client.SharedKVStore does over gRPC, minus the wire)."""

    def __init__(self, num_pages: int = 16, lease_s: float = 10.0) -> None:
        from speckv.services.common.clock import ManualClock
        from speckv.services.common.geometry import KVGeometry
        from speckv.services.kvstore.shm.backend import SharedMemoryBackend
        from speckv.services.kvstore.shm.mapped_pool import MappedPools, SharedPoolInfo
        from speckv.services.kvstore.store import KVStoreCore

        self.geometry = KVGeometry(num_layers=LAYOUT.num_layers, num_kv_heads=LAYOUT.num_kv_heads,
                                   head_dim=LAYOUT.head_dim, dtype=LAYOUT.dtype, block_size=LAYOUT.block_size)
        self.store = KVStoreCore("n1", self.geometry, num_pages, ManualClock(1000.0),
                                 backend=SharedMemoryBackend("n1"))
        self.pools = MappedPools([SharedPoolInfo(t.medium, a, num_pages) for t, a in
                                  self.store.shared_arenas().items()], self.geometry)
        self.lease_s = lease_s
        self.released = 0

    def map_for_read(self, ids, prefix=False):
        import time

        from speckv.services.common.errors import SpeckvError
        from speckv.services.engine.vllm_connector.port import ReadLease

        started = time.monotonic()
        try:
            places = self.store.map_blocks(list(ids), 10.0, prefix=prefix)
        except SpeckvError:
            return None
        tokens = {t.medium: a.token for t, a in self.store.shared_arenas().items()}
        return ReadLease(tuple(ids[:len(places)]), tuple(p.page for p in places),
                         tuple(p.tier.medium for p in places), tokens, started + self.lease_s)

    def map_prefix(self, ids):
        """The KVStorePort side of pinning at lookup, over the same core."""
        return self.map_for_read(ids, prefix=True)

    def pools_for(self, lease):
        return self.pools if all(self.pools.token(m) == t for m, t in lease.tokens.items()) else None

    def release(self, lease):
        if lease.ids:
            self.store.unpin(list(lease.ids))
        self.released += 1

    def reserve(self, ids, parent, family):
        from speckv.services.engine.vllm_connector.port import WriteSlot

        grant = self.store.reserve("save", list(ids), 10.0, family=family, parent=parent)
        tier, pages = self.store.reservation_pages(grant.handle)
        where = {h: i for i, h in enumerate(ids)}
        return WriteSlot(grant.handle, tuple(where[h] for h in grant.hashes), tuple(pages), tier.medium)

    def commit(self, slot):
        self.store.commit_shared(slot.handle, self.pools.blocks_crcs(slot.medium, slot.pages), 0.0)
        return True

    def pool(self, medium):
        return self.pools.pool(medium)
