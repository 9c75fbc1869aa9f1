"""Builds the read-only views a policy plans from (views.py: NodeView,
ClusterView) out of the core's live state at one clock time. Called by
SchedulerCore under its lock; the views hold references to the live index,
families and reuse history, valid only while that lock is held (plan())."""
from __future__ import annotations

from speckv.services.scheduler.cluster import Cluster, Node
from speckv.services.scheduler.families import FamilyCatalog
from speckv.services.scheduler.holder_index import HolderIndex
from speckv.services.scheduler.orders import OrderTracker
from speckv.services.scheduler.replication.replicas import LeasedReplicas
from speckv.services.scheduler.reuse_history import ReuseHistory
from speckv.services.scheduler.routing.disk_backlog import DiskBacklog
from speckv.services.scheduler.routing.join_ramp import JoinRamp
from speckv.services.scheduler.routing.link_backlog import LinkBacklog
from speckv.services.scheduler.views import ClusterView, NodeView


def node_view(cluster: Cluster, index: HolderIndex, n: Node, now: float) -> NodeView:
    return NodeView(n.node_id, n.address, cluster.is_alive(n, now), n.sizes,
                    n.load.free_pages, n.queued_tokens, n.load.running_tokens, n.waiting_requests,
                    n.geometry.block_size, n.bytes_per_block, index.num_blocks(n.node_id),
                    cluster.queue_ms(n), index.num_host_blocks(n.node_id),
                    index.num_device_blocks(n.node_id), n.load.retained_blocks,
                    n.retained_reported_at, n.generation)


def cluster_view(now: float, cluster: Cluster, index: HolderIndex, orders: OrderTracker, families: FamilyCatalog,
                 ledger: LeasedReplicas, link_bytes_per_s: float, backlog: LinkBacklog, reuse: ReuseHistory,
                 ramp: JoinRamp, disks: DiskBacklog | None = None) -> ClusterView:
    """The whole cluster at now: O(nodes + active orders)."""
    nodes = cluster.nodes()
    return ClusterView(now, tuple(node_view(cluster, index, n, now) for n in nodes),
                       index, tuple(o.snapshot() for o in orders.active()),
                       families, {n.node_id: ledger.blocks_on(n.node_id) for n in nodes},
                       link_bytes_per_s, backlog.waits(now), backlog.rates(now), reuse,
                       frozenset(ramp.ramping(now)),
                       disks.waits(now) if disks else {}, disks.rates(now) if disks else {})
