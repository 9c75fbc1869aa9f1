"""NodeSizes: a node's sizes, the one record that carries them from its
registration through the scheduler (cluster Node, NodeView, saved state,
planner) and through the launcher and the simulator's settings.

Units: blocks (a page holds one block of `block_size` tokens).
- device_pages: its device (GPU) tier's capacity; > 0 where a node registers.
- host_pages: its host (CPU) tier's capacity; 0: no host tier.
- retain_max_blocks: the most its last tier (host if it has one, else
  device) holds under retain orders at once; None: not reported (a node
  whose store does not say), 0: retain orders retain nothing.

The wire (RegisterNode's capacity_pages, host_pages, retain_max_blocks),
the CLI flags and the configuration files keep their own names; they are
read into this record at the boundary.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeSizes:
    device_pages: int
    host_pages: int = 0
    retain_max_blocks: int | None = None

    @property
    def last_tier_pages(self) -> int:
        """The pages of the tier blocks leave the node from (host, else device)."""
        return self.host_pages or self.device_pages

    @staticmethod
    def with_retain_share(device_pages: int, host_pages: int, retain_max_share: float) -> NodeSizes:
        """Sizes whose retention cap is retain_max_share of the last tier, rounded down
        (the kvstore's rule: store.py sizes its Retention the same way)."""
        return NodeSizes(device_pages, host_pages, int(retain_max_share * (host_pages or device_pages)))
