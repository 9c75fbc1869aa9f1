"""What SchedulerCore is built with: its settings, the interfaces through
which it calls out, and the records of its durable state. The server
(adapters/server.py) injects the live implementations; the simulator and the
tests inject their own or none.

- PrefixConfirmer: after the router picks a node, Route confirms the cached
  prefix with that node's kvstore (outside the lock). When it does not answer
  the index's figure stands and the result says `confirmed=False`.
- ArrivalSink: every routed request is offered as an arrival (never blocks).
- NodeListener: hears about (re-)registrations so the server can (re)start
  that node's KV event stream.
- StateJournal (optional; adapters/state_store.py): the durable control
  state. The core calls it, under its lock, at each change a restart must not
  forget: SetPolicy, a node's registration, each order's submission and
  transition (through the OrderTracker's journal), and the committed copies
  by transport (through the TransportTally's). `restore()` resumes from
  what it saved (SavedState, SavedNode). Without one (the simulator, the
  tests, the default) all of it lives in memory only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.arrival_reports import ArrivalRecord
from speckv.services.scheduler.policy_config import PolicyConfig
from speckv.services.scheduler.orders import Order, OrderJournal, OrderState
from speckv.services.scheduler.replication.transports import Carried, TransportJournal


class PrefixConfirmer(Protocol):
    def confirm(self, address: str, block_hashes: Sequence[int]) -> int | None:
        """Blocks of the longest prefix present at address; None if it did not answer."""
        ...

    def asks(self, address: str) -> bool:
        """Whether address has a kvstore to ask (a vLLM-fed node has none:
        its prefixes stand on the index alone, and no answer is news)."""
        ...


class ArrivalSink(Protocol):
    def offer(self, arrival: ArrivalRecord) -> bool: ...


class NodeListener(Protocol):
    def node_registered(self, node_id: NodeId, address: str, generation: int, old_address: str | None) -> None: ...


@dataclass(frozen=True, slots=True)
class SavedNode:
    """A registration as the durable state keeps it (what RegisterNode said)."""

    node_id: NodeId
    address: str
    sizes: NodeSizes  # its tiers' pages and retention cap
    geometry: KVGeometry


@dataclass(slots=True)
class SavedState:
    """What a previous run left in the durable state (SchedulerCore.restore).
    policy: the one SetPolicy last chose ("" = never called); orders: active
    ones in any order, terminal ones in the order they finished;
    next_order_id: the number the next generated order id carries (above
    every id ever generated); order_totals: orders that ever reached each
    terminal state; transports: the committed copies each transport carried
    between each pair of nodes."""

    policy: str = ""
    nodes: list[SavedNode] = field(default_factory=list)
    orders: list[Order] = field(default_factory=list)
    next_order_id: int = 1
    order_totals: dict[OrderState, int] = field(default_factory=dict)
    transports: list[Carried] = field(default_factory=list)  # committed copies per (source, target, transport)


class StateJournal(OrderJournal, TransportJournal, Protocol):
    """The durable control state: each call is one transaction, made under
    the core's lock, before the call that made the change returns. A write
    that fails raises (Unavailable) and so fails that call."""

    def policy_set(self, name: str) -> None: ...

    def node_registered(self, node: SavedNode) -> None: ...


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    node_timeout_s: float = 5.0
    heartbeat_interval_ms: int = 1000
    policy: str = "none"
    link_gbps: float = 25.0
    link_overhead_ms: float = 1.0
    host_link_gbps: float = 0.0  # each node's host<->device link (PCIe), Gbit/s; 0: no host tiers to price
    host_link_overhead_ms: float = 0.0
    disk_gbps: float = 0.0  # each node's disk-tier reads, Gbit/s (the router's disk loads); 0: priced as host hits
    disk_overhead_ms: float = 0.0
    router_seed: int = 0
    tie_ms: float = 1.0
    watch_queue: int = 1024
    policy_config: PolicyConfig | None = None  # None: the committed services/config/policies.json
