"""The scheduler's shared vocabulary: the read-only views of the cluster a
policy plans from and the replication planners price (NodeView, ClusterView
and the index, family and reuse readers), the Plan a tick applies, and the
one query both sides ask of a view (holders_of: who holds a prefix worth
routing to). Policies and replication import this module, never each other's
internals for it. Sizes are in blocks (pages) unless a name says otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from speckv.services.common.engine_profile import EngineProfile
from speckv.services.common.ids import BlockHash, Family, NodeId, OrderId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.families import FamilyProfile, SurgeHistory
from speckv.services.scheduler.orders import Order, OrderSpec


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: NodeId
    address: str
    alive: bool
    sizes: NodeSizes  # its tiers' capacities and retention cap, as registered
    free_pages: int
    queued_tokens: int
    running_tokens: int
    waiting_requests: int
    block_size: int
    bytes_per_block: int
    num_blocks: int  # in either tier
    queue_ms: float  # expected wait before new work's prefill starts (the router's figure)
    host_blocks: int = 0  # blocks its host tier holds
    device_blocks: int = 0  # blocks its device tier holds (the index's view)
    retained_blocks: int | None = None  # blocks its last tier holds under retain orders, as last reported (None: not)
    retained_at: float | None = None  # clock s of that report
    generation: int = 0  # its registration's number: a new one is a store that may have restarted empty


class IndexReader(Protocol):
    """Read-only block index (valid only during plan())."""

    def holders(self, block_hash: int) -> frozenset[NodeId]: ...
    def family_nodes(self, family: Family) -> frozenset[NodeId]: ...
    def family_root(self, family: Family) -> BlockHash | None: ...
    def families(self) -> list[Family]: ...
    def longest_prefix(self, node: NodeId, block_hashes: Sequence[int]) -> int: ...
    def prefix_lengths(self, block_hashes: Sequence[int], min_length: int = 1) -> dict[NodeId, int]: ...
    def host_only_count(self, node: NodeId, block_hashes: Sequence[int], length: int) -> int: ...
    def disk_only_count(self, node: NodeId, block_hashes: Sequence[int], length: int) -> int: ...


class ReuseReader(Protocol):
    """P(a block pushed out of a node's tier is wanted again soon); see reuse_history.py."""

    def p_reuse(self, node: NodeId, tier: Tier, now: float) -> float: ...
    def removal_rate(self, node: NodeId, tier: Tier, now: float) -> float: ...


class FamilyReader(Protocol):
    """Read-only family catalog (valid only during plan()); see families.py."""

    def profile(self, family: Family) -> FamilyProfile | None: ...
    def heat(self, family: Family, now: float) -> int: ...
    def hot(self, now: float, threshold: int) -> list[tuple[Family, int]]: ...
    def surging(self, now: float, threshold: int) -> list[tuple[Family, int]]: ...
    def surge_history(self, family: Family, now: float) -> SurgeHistory | None: ...
    def hottest_by_node(self, now: float) -> dict[NodeId, tuple[Family, int]]: ...
    def node_route_rates(self, now: float) -> dict[NodeId, float]: ...


@dataclass(frozen=True, slots=True)
class ClusterView:
    now: float
    nodes: tuple[NodeView, ...]
    index: IndexReader
    active_orders: tuple[Order, ...]
    families: FamilyReader | None = None
    replica_blocks: Mapping[NodeId, int] = field(default_factory=dict)  # blocks under a running replica lease
    link_bytes_per_s: float = 0.0  # every node's link rate (the router's link model)
    link_wait_ms: Mapping[NodeId, float] = field(default_factory=dict)  # until its link is free (link_backlog.py)
    pulls_per_s: Mapping[NodeId, float] = field(default_factory=dict)  # recent rate of pulls on its link
    reuse: ReuseReader | None = None
    joining: frozenset[NodeId] = frozenset()  # nodes still ramping after joining a serving cluster (join_ramp.py)
    disk_wait_ms: Mapping[NodeId, float] = field(default_factory=dict)  # until its disk is free (disk_backlog.py)
    disk_loads_per_s: Mapping[NodeId, float] = field(default_factory=dict)  # recent rate of routed disk loads

    def live_nodes(self) -> list[NodeView]:
        return [n for n in self.nodes if n.alive]


@dataclass(slots=True)
class Plan:
    """What a policy wants this tick: new orders, and ISSUED orders to cancel."""

    orders: list[OrderSpec] = field(default_factory=list)
    cancel: list[OrderId] = field(default_factory=list)


def min_worth_blocks(profile: EngineProfile, prompt_tokens: float, block_size: int, chain_blocks: int,
                     min_benefit_ms: float) -> int | None:
    """The fewest leading blocks (1..chain_blocks) whose cache saves at least
    min_benefit_ms of a prompt_tokens prefill, or None when even the whole
    chain saves less. Binary search: the saving only grows with the cached
    prefix (prefill_ms falls as cached tokens replace new ones)."""
    prompt = max(int(prompt_tokens), 1)
    full_ms = profile.prefill_ms(prompt, 0)

    def saves(blocks: int) -> bool:
        cached = min(blocks * block_size, prompt - 1)
        return full_ms - profile.prefill_ms(prompt - cached, cached) >= min_benefit_ms

    if chain_blocks < 1 or not saves(chain_blocks):
        return None
    lo, hi = 1, chain_blocks
    while lo < hi:
        mid = (lo + hi) // 2
        if saves(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def holders_of(view: ClusterView, family: FamilyProfile, live: dict[NodeId, NodeView], profile: EngineProfile,
               min_benefit_ms: float) -> dict[NodeId, int]:
    """Live nodes whose prefix of the family's chain saves >= min_benefit_ms -> blocks held.

    Saving = prefill_ms(P, 0) - prefill_ms(P - L*S, L*S) for the family's mean
    prompt P (tokens), block size S and L blocks held; at least one token is
    always computed, as in the engine and the planner. Only nodes holding at
    least the smallest such L are walked, so a block every node holds costs
    nothing however many nodes there are.
    """
    if not live:
        return {}
    block_size = next(iter(live.values())).block_size
    min_length = min_worth_blocks(profile, family.prompt_tokens, block_size, len(family.chain), min_benefit_ms)
    if min_length is None:
        return {}
    return {node: length for node, length in view.index.prefix_lengths(family.chain, min_length).items()
            if node in live}
