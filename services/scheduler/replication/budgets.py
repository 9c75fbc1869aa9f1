"""Per-link bandwidth and per-node memory budgets for speculative copies.

Every replicating policy spends from one BudgetBook built fresh each tick, so
no policy can exceed them, whichever it is:
- link: each node's egress and ingress may carry at most
  `link_budget_fraction * link_bytes_per_s * link_budget_window_s` bytes of
  speculative orders at once; bytes of orders still ISSUED or IN_FLIGHT count
  against both ends, so budgets hold across ticks, not just within one.
  An order larger than the whole budget (a prefix longer than the link
  carries in its budget window: 46 blocks of 64 MiB at 25 Gbit/s, half of
  2 s) may still go when both its ends carry no other speculative bytes:
  the budget bounds the share of the link speculation takes, not the length
  of the prefixes it may copy, and while that order is active it keeps both
  ends' budgets full.
- memory: each node may hold at most `replica_memory_fraction *
  sizes.device_pages` blocks of speculative replicas (leases still running) plus
  blocks of orders still landing there.

Not thread-safe; lives for one plan() call.
"""
from __future__ import annotations

from collections import defaultdict

from speckv.services.common.ids import NodeId
from speckv.services.scheduler.policy_config import BudgetSettings
from speckv.services.scheduler.views import ClusterView, NodeView


class BudgetBook:
    def __init__(self, view: ClusterView, settings: BudgetSettings) -> None:
        self.link_budget = settings.link_budget_fraction * view.link_bytes_per_s * settings.link_budget_window_s
        self._nodes: dict[NodeId, NodeView] = {n.node_id: n for n in view.nodes}
        self._egress: dict[NodeId, float] = defaultdict(float)
        self._ingress: dict[NodeId, float] = defaultdict(float)
        self._memory: dict[NodeId, int] = defaultdict(int, view.replica_blocks)
        self._fraction = settings.replica_memory_fraction
        for order in view.active_orders:
            spec = order.spec
            if not spec.action.copies:
                continue  # a prefetch or retain moves nothing over the network and makes no replica
            node = self._nodes.get(spec.target)
            nbytes = len(spec.block_hashes) * (node.bytes_per_block if node else 0)
            self._egress[spec.source] += nbytes
            self._ingress[spec.target] += nbytes
            self._memory[spec.target] += len(spec.block_hashes)

    def memory_limit(self, node: NodeId) -> int:
        view = self._nodes.get(node)
        return int(self._fraction * view.sizes.device_pages) if view else 0

    def fits(self, source: NodeId, target: NodeId, blocks: int, nbytes: int) -> bool:
        if self._memory[target] + blocks > self.memory_limit(target):
            return False
        egress, ingress = self._egress[source], self._ingress[target]
        if nbytes > self.link_budget:
            return egress == 0 and ingress == 0  # oversize: alone on both links
        return egress + nbytes <= self.link_budget and ingress + nbytes <= self.link_budget

    def take(self, source: NodeId, target: NodeId, blocks: int, nbytes: int) -> None:
        self._egress[source] += nbytes
        self._ingress[target] += nbytes
        self._memory[target] += blocks

    def egress_left(self, node: NodeId) -> float:
        return self.link_budget - self._egress[node]

    def usage(self) -> dict[str, dict[NodeId, float]]:
        """Spent budget per node (tests and metrics)."""
        return {"egress": dict(self._egress), "ingress": dict(self._ingress),
                "memory": {k: float(v) for k, v in self._memory.items()}}
