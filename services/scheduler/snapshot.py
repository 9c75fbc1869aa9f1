"""What the scheduler reports about itself: per-node views, the cluster
snapshot behind GetClusterState and `speckv status`, and the active policy."""
from __future__ import annotations

from dataclasses import dataclass, field

from speckv.services.scheduler.orders import OrderState
from speckv.services.scheduler.replication.replicas import ReplicaStats
from speckv.services.scheduler.replication.transports import Carried
from speckv.services.scheduler.views import NodeView


@dataclass(frozen=True, slots=True)
class NodeReport:
    view: NodeView
    last_heartbeat_age_s: float
    routes_total: int


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    nodes: tuple[NodeReport, ...]
    policy: str
    order_counts: dict[OrderState, int]
    num_families: int
    now: float
    replicas: ReplicaStats = field(default_factory=ReplicaStats)
    retries: int = 0
    transports: tuple[Carried, ...] = ()  # committed copies per (source, target, transport)


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    name: str
    available: tuple[str, ...]
    description: str
