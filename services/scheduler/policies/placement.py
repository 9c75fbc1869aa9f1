"""Shared by the reactive policies: one copy of a family's prefix from its
best holder to the least-queued eligible node, if the budgets allow.

Holders (views.holders_of, shared with the planner): live nodes whose
cached prefix of the family's chain saves at least `planner.min_benefit_ms`
of prefill per request (the planner's rule). A node
holding only what every conversation shares (a system-prompt block) is a
target like any other, not a holder. Source: the holder with the longest
prefix (ties: least queued, then id). Target: the first node of `targets` (already
ordered least queued first by the caller) that holds none of the chain, is
not excluded, and fits the BudgetBook. The order copies the source's prefix.
"""
from __future__ import annotations

from typing import Iterable

from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.replication.budgets import BudgetBook
from speckv.services.scheduler.orders import OrderSpec
from speckv.services.scheduler.views import ClusterView, NodeView


def queue_ms(nodes: Iterable[NodeView]) -> dict[NodeId, float]:
    return {n.node_id: n.queue_ms for n in nodes}


def landing_targets(view: ClusterView, family: Family) -> set[NodeId]:
    return {o.spec.target for o in view.active_orders if o.spec.family == family}


def copy_order(family: Family, chain: list[int], holders: dict[NodeId, int], queue: dict[NodeId, float],
               targets: Iterable[NodeId], exclude: set[NodeId], book: BudgetBook, live: dict[NodeId, NodeView],
               lease_ms: int, policy: str) -> OrderSpec | None:
    if not holders:
        return None
    held = max(holders.values())
    source = min((n for n, k in holders.items() if k == held), key=lambda n: (queue[n], n))
    for target in targets:
        if target in holders or target in exclude or target == source:
            continue
        nbytes = held * live[target].bytes_per_block
        if book.fits(source, target, held, nbytes):
            book.take(source, target, held, nbytes)
            return OrderSpec(family, list(chain[:held]), source, target, lease_ms, policy=policy)
    return None
