"""The policy interface: every tick the scheduler shows the active policy a
read-only view of the cluster and submits the orders it returns.

A policy is a small object with a `name`, a one-paragraph `description` and
`plan(now, view) -> list[OrderSpec] | Plan` (a Plan also names ISSUED orders
to cancel). A policy whose plan reads no view may set `needs_view = False`;
it is then passed None instead of a view built every tick. `plan` runs on the ticker thread with
the scheduler's lock held, so it must be quick and must not do I/O; a policy
that needs remote inputs (forecasts) fetches them in `prepare(now)`, which runs
first, without the lock. The same objects run in the live cluster and in the
discrete-event simulator, so they take time only from `now`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from speckv.services.common.ids import BlockHash, Family, NodeId, OrderId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.families import FamilyProfile, SurgeHistory
from speckv.services.scheduler.replication.orders import Order, OrderSpec


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: NodeId
    address: str
    alive: bool
    capacity_pages: int
    free_pages: int
    queued_tokens: int
    running_tokens: int
    waiting_requests: int
    block_size: int
    bytes_per_block: int
    num_blocks: int  # in either tier
    queue_ms: float  # expected wait before new work's prefill starts (the router's figure)
    host_pages: int = 0  # its host tier's capacity (0: none)
    host_blocks: int = 0  # blocks its host tier holds
    device_blocks: int = 0  # blocks its device tier holds (the index's view)
    retain_max_blocks: int | None = None  # blocks its last tier retains for retain orders at once (None: unknown)
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

    def live_nodes(self) -> list[NodeView]:
        return [n for n in self.nodes if n.alive]


@dataclass(slots=True)
class Plan:
    """What a policy wants this tick: new orders, and ISSUED orders to cancel."""

    orders: list[OrderSpec] = field(default_factory=list)
    cancel: list[OrderId] = field(default_factory=list)


class Policy(Protocol):
    name: str
    description: str

    def prepare(self, now: float) -> None:
        """Gathers remote inputs before plan(); runs without the scheduler lock."""
        ...

    def plan(self, now: float, view: ClusterView | None) -> "list[OrderSpec] | Plan":
        """Orders to issue now; invalid ones are logged and dropped."""
        ...
