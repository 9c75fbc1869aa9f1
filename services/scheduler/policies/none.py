"""Policy `none`: no speculative replication.

The honest baseline. Requests are still routed KV-aware and load-aware (the
router's expected-TTFT formula, see router.py), and a request may still pull
its prefix on demand from another node when that beats recomputing it, as
Dynamo's KV router, llm-d's precise prefix-cache scorer with P2P pulls, and
Mooncake's conductor do. This policy only declines to copy anything ahead of
time: plan() always returns no orders.
"""
from __future__ import annotations

from speckv.services.scheduler.orders import OrderSpec
from speckv.services.scheduler.views import ClusterView


class NonePolicy:
    name = "none"
    description = ("KV-aware, load-aware routing with on-demand prefix pulls; "
                   "no speculative replication (emits no orders).")
    needs_view = False  # plan() reads nothing: the scheduler skips building the view

    def prepare(self, now: float) -> None:
        return None

    def plan(self, now: float, view: ClusterView | None) -> list[OrderSpec]:
        return []
