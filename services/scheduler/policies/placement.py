"""Shared by the reactive policies: one copy of a family's prefix from its
best holder to the least-queued eligible node, if the budgets allow.

Holders: live nodes whose cached prefix of the family's chain saves at least
`planner.min_benefit_ms` of prefill per request (the planner's rule). A node
holding only what every conversation shares (a system-prompt block) is a
target like any other, not a holder. Source: the holder with the longest
prefix (ties: least queued, then id). Target: the first node of `targets` (already
ordered least queued first by the caller) that holds none of the chain, is
not excluded, and fits the BudgetBook. The order copies the source's prefix.
"""
from __future__ import annotations

from typing import Iterable

from speckv.services.common.engine_profile import EngineProfile
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.families import FamilyProfile
from speckv.services.scheduler.policies.base import ClusterView, NodeView
from speckv.services.scheduler.replication.budgets import BudgetBook
from speckv.services.scheduler.replication.orders import OrderSpec


def queue_ms(nodes: Iterable[NodeView]) -> dict[NodeId, float]:
    return {n.node_id: n.queue_ms for n in nodes}


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
