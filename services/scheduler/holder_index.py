"""Which node holds which KV block, fed by the kvstores' KV events.

Two maps kept in step, so every update is O(1) per block:
  holders:   block hash -> the node holding it, or the set of nodes when
             more than one does (most blocks have one holder: no set per
             block to allocate on every store and free on every eviction)
  inventory: node -> set of block hashes it holds
plus prefix families: family -> the hash of its first block (a chain root),
so "nodes holding the family" is holders(root). Roots are learnt from events
whose blocks start a chain (has_parent false) and from routed requests; a
family is forgotten once no node holds its root, so the map is bounded by the
resident blocks.

Tiers: a node may keep a block in its device tier, its host tier or both
(services/common/tiers.py). The two maps above are the union: a node holds a
block while either tier does, which is what prefix matching needs. Beside
them, per node with a host tier, `host` is what that tier holds and
`host_only` what only it holds: the blocks a route there must promote
before prefill. A node that never reported a host event has neither set, so
a cluster without host tiers pays nothing for them. The disk tier (medium
STORAGE) is kept the same way in `disk`: a block only the disk holds is in
`host_only` too (below the device tier: a route there stages it up before
prefill), and `disk_only_count` says which of them a route there loads
from the disk (the router prices those as disk loads).

Event semantics (vLLM KV events): STORED and COMMITTED add blocks to the
event's tier, REMOVED drops them from it, SNAPSHOT replaces the node's whole
inventory with the event's blocks in its tier (and host_hashes in the host
tier). Not thread-safe:
SchedulerCore serialises access.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Collection, Sequence

from speckv.services.common.ids import BlockHash, Family, NodeId, default_family
from speckv.services.common.tiers import Tier


class HolderEventKind(enum.Enum):
    STORED = "stored"
    REMOVED = "removed"
    COMMITTED = "committed"
    SNAPSHOT = "snapshot"


@dataclass(slots=True)
class IndexEvent:
    """A KV event as the index needs it (decoupled from the proto)."""

    kind: HolderEventKind
    block_hashes: list[int]
    has_parent: bool = False
    family: str = ""
    sequence: int = 0
    tier: Tier = Tier.DEVICE
    host_hashes: list[int] | None = None  # SNAPSHOT only: the host tier's blocks (block_hashes: the device tier's)
    disk_hashes: list[int] | None = None  # SNAPSHOT only: the disk tier's blocks


@dataclass(slots=True)
class HolderIndex:
    _holders: dict[int, NodeId | set[NodeId]] = field(default_factory=dict)
    _inventory: dict[NodeId, set[int]] = field(default_factory=dict)
    _family_root: dict[Family, int] = field(default_factory=dict)
    _root_families: dict[int, set[Family]] = field(default_factory=dict)
    _host: dict[NodeId, set[int]] = field(default_factory=dict)  # in the node's host tier
    _host_only: dict[NodeId, set[int]] = field(default_factory=dict)  # below its device tier only (host or disk)
    _disk: dict[NodeId, set[int]] = field(default_factory=dict)  # in the node's disk tier

    def apply(self, node: NodeId, event: IndexEvent) -> None:
        if event.kind is HolderEventKind.SNAPSHOT:
            self.drop_node(node)
            self._store(node, event.block_hashes, event.tier)
            if event.host_hashes:
                self._store(node, event.host_hashes, Tier.HOST)
            if event.disk_hashes:
                self._store(node, event.disk_hashes, Tier.DISK)
        elif event.kind in (HolderEventKind.STORED, HolderEventKind.COMMITTED):
            self._store(node, event.block_hashes, event.tier)
            if not event.has_parent and event.block_hashes:
                family = Family(event.family) if event.family else default_family(event.block_hashes)
                self.note_family(family, event.block_hashes[0])
        elif event.kind is HolderEventKind.REMOVED:
            if event.tier is Tier.HOST:
                self._remove_host(node, event.block_hashes)
            elif event.tier is Tier.DISK:
                self._remove_disk(node, event.block_hashes)
            else:
                self._remove_device(node, event.block_hashes)

    def drop_node(self, node: NodeId) -> None:
        """Forgets everything node holds (re-registration, snapshot, removal)."""
        self._host.pop(node, None)
        self._host_only.pop(node, None)
        self._disk.pop(node, None)
        for h in self._inventory.pop(node, set()):
            self._unhold(node, h)

    def has_lower_tiers(self) -> bool:
        """False when no node has reported a block below its device tier
        (host_only_count and disk_only_count are then 0 for every node)."""
        return bool(self._host_only)

    def host_only_count(self, node: NodeId, block_hashes: Sequence[int], length: int) -> int:
        """How many of the first length hashes node holds in its host tier
        alone (what a route there promotes before prefill)."""
        only = self._host_only.get(node)
        if not only or length <= 0:
            return 0
        return sum(1 for h in block_hashes[:length] if h in only)

    def disk_only_count(self, node: NodeId, block_hashes: Sequence[int], length: int) -> int:
        """How many of the first length hashes node holds in its disk tier
        alone (of host_only_count's: what a route there loads from disk)."""
        disk = self._disk.get(node)
        if not disk or length <= 0:
            return 0
        host = self._host.get(node, ())
        only = self._host_only.get(node, ())
        return sum(1 for h in block_hashes[:length] if h in disk and h in only and h not in host)

    def num_host_blocks(self, node: NodeId) -> int:
        return len(self._host.get(node, ()))

    def note_family(self, family: Family, root: int) -> None:
        """Records root as family's first block, if some node holds it."""
        if not family or root not in self._holders:
            return
        old = self._family_root.get(family)
        if old == root:
            return
        if old is not None:
            self._forget_root_family(old, family)
        self._family_root[family] = root
        self._root_families.setdefault(root, set()).add(family)

    def holders(self, block_hash: int) -> frozenset[NodeId]:
        return frozenset(self.holder_set(block_hash))

    def holder_set(self, block_hash: int) -> Collection[NodeId]:
        """The nodes holding block_hash, without a copy: read it before the
        next event is applied, never keep it."""
        held = self._holders.get(block_hash)
        if held is None:
            return ()
        return (held,) if isinstance(held, str) else held

    def family_nodes(self, family: Family) -> frozenset[NodeId]:
        root = self._family_root.get(family)
        return self.holders(root) if root is not None else frozenset()

    def family_root(self, family: Family) -> BlockHash | None:
        root = self._family_root.get(family)
        return BlockHash(root) if root is not None else None

    def families(self) -> list[Family]:
        return list(self._family_root)

    def longest_prefix(self, node: NodeId, block_hashes: Sequence[int]) -> int:
        """Number of leading hashes node holds."""
        held = self._inventory.get(node, ())
        count = 0
        for h in block_hashes:
            if h not in held:
                break
            count += 1
        return count

    def prefix_lengths(self, block_hashes: Sequence[int], min_length: int = 1) -> dict[NodeId, int]:
        """longest_prefix for every node holding at least the first
        min_length blocks (>= 1); nodes with shorter prefixes are left out.

        Only the holders of block min_length - 1 walk the chain, each down its
        own inventory: the cost is the sum of their prefixes, not nodes x
        blocks, and with min_length > 1 a first block every node holds (a
        shared system prompt) costs nothing. Listed shortest prefix first
        (ties: the holder set's order), as one shared walk would drop them."""
        start = max(1, min_length) - 1
        if start >= len(block_hashes):
            return {}
        inventory, holders = self._inventory, self._holders
        first = holders.get(block_hashes[start])
        if first is None:
            return {}
        if isinstance(first, str):
            # One node holds the walk's first block (most chains): its prefix is
            # what its inventory holds in a row, holders and inventory being in step.
            held = inventory[first]
            if start and any(h not in held for h in block_hashes[:start]):
                return {}
            length = start + 1
            for h in block_hashes[length:]:
                if h not in held:
                    break
                length += 1
            return {first: length}
        if start:
            alive = {n for n in first if all(h in inventory[n] for h in block_hashes[:start])}
        else:
            alive = {n for n in first}  # a new set, built as above: the same order
        # Each node walks its own inventory (a set lookup per block, no holder set to
        # compare); listed by length, ties in the set's order: the order in which one
        # shared walk down the chain would drop them.
        rest = block_hashes[start + 1:]
        found: list[tuple[int, NodeId]] = []
        for node in alive:
            held, length = inventory[node], start + 1
            for h in rest:
                if h not in held:
                    break
                length += 1
            found.append((length, node))
        found.sort(key=_first)
        return {node: length for length, node in found}

    def num_blocks(self, node: NodeId) -> int:
        return len(self._inventory.get(node, ()))

    def num_device_blocks(self, node: NodeId) -> int:
        return len(self._inventory.get(node, ())) - len(self._host_only.get(node, ()))

    def num_families(self) -> int:
        return len(self._family_root)

    def _store(self, node: NodeId, hashes: Sequence[int], tier: Tier) -> None:
        if tier is Tier.DEVICE:
            only = self._host_only.get(node)
            if only:
                only.difference_update(hashes)
            self._add(node, hashes)
            return
        held = self._inventory.get(node, ())
        (self._disk if tier is Tier.DISK else self._host).setdefault(node, set()).update(hashes)
        fresh = [h for h in hashes if h not in held]  # a demoted block is held already: only its tier changes
        if fresh:
            self._host_only.setdefault(node, set()).update(fresh)
            self._add(node, fresh)
        else:
            self._host_only.setdefault(node, set())

    def _remove_device(self, node: NodeId, hashes: Sequence[int]) -> None:
        """Drops hashes from node's device tier: a block its host tier keeps
        stays held (host-only); any other leaves the node."""
        held = self._inventory.get(node)
        if held is None:
            return
        host = self._host.get(node)
        disk = self._disk.get(node)
        only = self._host_only.get(node)
        for h in hashes:
            if h not in held:
                continue
            if (host is not None and h in host) or (disk is not None and h in disk):
                only.add(h)  # type: ignore[union-attr]
                continue
            held.discard(h)
            self._unhold(node, h)

    def _remove_host(self, node: NodeId, hashes: Sequence[int]) -> None:
        """Drops hashes from node's host tier: a block only that tier held leaves the node."""
        host = self._host.get(node)
        if not host:
            return
        only = self._host_only[node]
        disk = self._disk.get(node, ())
        for h in hashes:
            if h not in host:
                continue
            host.discard(h)
            if h in only and h not in disk:
                only.discard(h)
                self._remove(node, h)

    def _remove_disk(self, node: NodeId, hashes: Sequence[int]) -> None:
        """Drops hashes from node's disk tier: a block only that tier held leaves the node."""
        disk = self._disk.get(node)
        if not disk:
            return
        only = self._host_only.setdefault(node, set())
        host = self._host.get(node, ())
        for h in hashes:
            if h not in disk:
                continue
            disk.discard(h)
            if h in only and h not in host:
                only.discard(h)
                self._remove(node, h)

    def _add(self, node: NodeId, hashes: Sequence[int]) -> None:
        held = self._inventory.setdefault(node, set())
        holders = self._holders
        for h in hashes:
            nodes = holders.setdefault(h, node)  # a fresh block (most): one lookup, held by node alone
            if nodes is node:
                continue
            if isinstance(nodes, str):
                if nodes != node:
                    holders[h] = {nodes, node}
            else:
                nodes.add(node)
        held.update(hashes)

    def _remove(self, node: NodeId, h: int) -> None:
        held = self._inventory.get(node)
        if held is not None and h in held:
            held.discard(h)
            self._unhold(node, h)

    def _unhold(self, node: NodeId, h: int) -> None:
        nodes = self._holders.get(h)
        if nodes is None:
            return
        if isinstance(nodes, str):
            if nodes != node:
                return
        else:
            nodes.discard(node)
            if nodes:
                return  # a set stays a set until it empties
        del self._holders[h]
        families = self._root_families.pop(h, None)
        if families:
            for family in families:
                self._family_root.pop(family, None)

    def _forget_root_family(self, root: int, family: Family) -> None:
        families = self._root_families.get(root)
        if families is not None:
            families.discard(family)
            if not families:
                del self._root_families[root]


def _first(item: tuple[int, NodeId]) -> int:
    return item[0]
