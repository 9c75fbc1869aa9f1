"""Shared by the reactive policies: one copy of a family's prefix from its
best holder to the least-queued eligible node, if the budgets allow.

Source: the live node holding the longest prefix of the family's chain
(ties: least queued, then id). Target: the first node of `targets` (already
ordered least queued first by the caller) that holds none of the chain, is
not excluded, and fits the BudgetBook. The order copies the source's prefix.
"""
from __future__ import annotations

from typing import Iterable

from speckv.services.scheduler.budgets import BudgetBook
from speckv.services.scheduler.engine_profile import EngineProfile
from speckv.services.scheduler.ids import Family, NodeId
from speckv.services.scheduler.orders import OrderSpec
from speckv.services.scheduler.policies.base import ClusterView, NodeView


def queue_ms(profile: EngineProfile, nodes: Iterable[NodeView]) -> dict[NodeId, float]:
    return {n.node_id: profile.queue_ms(n.queued_tokens, n.waiting_requests) for n in nodes}


def holders_of(view: ClusterView, chain: list[int], live: dict[NodeId, NodeView]) -> dict[NodeId, int]:
    """Live nodes holding at least the first block of chain -> blocks held."""
    return {n: k for n, k in view.index.prefix_lengths(chain).items() if n in live and k > 0}


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
