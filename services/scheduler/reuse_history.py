"""How often a block that leaves a tier is wanted again soon: the planner's
P(reuse) for the blocks an action would push out.

Every block removed from a node's tier (a REMOVED event: dropped from the
node, or demoted from the device tier to the host tier below) becomes a
ghost of that (node, tier) for `window_s` seconds, as in ARC's ghost lists.
A route whose chain names a ghost within its window is a ghost hit when
the eviction cost that request: a host-tier ghost (the block left the
node) at a position the routed node computes again (past what it had
cached or pulled), a device-tier ghost (the block was demoted) when the
request went to that node, which then promotes it, or computes it again,
and a host-tier ghost also when the request went to that node and found
it cached: it went down to the disk tier below, which it is loaded from
(issue 44; without a disk, only a replica could have brought it back).
A ghost served from a cache anyway is forgotten without a hit. P(reuse) of (node, tier) = (ghost hits + prior_hits) /
(removals + prior_hits / prior_p) over exponentially decayed counts
(half-life `halflife_s`), so one quiet minute does not erase an hour of
history and a fresh node starts at prior_p.

The ghost map holds at most `max_ghosts` blocks (oldest dropped first);
a block removed from several nodes is a ghost of the latest one only (the
latest removal is the best guess at which node would have served it).
Time is the caller's clock, in seconds. Pure, not thread-safe.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier


@dataclass(frozen=True, slots=True)
class ReuseSettings:
    window_s: float = 60.0
    halflife_s: float = 300.0
    max_ghosts: int = 500_000
    prior_p: float = 0.5
    prior_weight: float = 4.0


@dataclass(slots=True)
class _Counts:
    removed: float = 0.0
    hits: float = 0.0
    at: float = 0.0  # when the counts were last decayed (s)
    since: float = 0.0  # when counting began (s)

    def decay(self, now: float, halflife_s: float) -> None:
        if now > self.at:
            factor = math.exp2(-(now - self.at) / halflife_s)
            self.removed *= factor
            self.hits *= factor
            self.at = now


class ReuseHistory:
    def __init__(self, settings: ReuseSettings = ReuseSettings()) -> None:
        self._s = settings
        self._ghosts: OrderedDict[int, tuple[NodeId, Tier, float]] = OrderedDict()
        self._counts: dict[tuple[NodeId, Tier], _Counts] = {}

    def removed(self, node: NodeId, tier: Tier, block_hashes: Sequence[int], now: float) -> None:
        """Blocks that left node's tier at now (s)."""
        if not block_hashes:
            return
        counts = self._at(node, tier, now)
        counts.removed += len(block_hashes)
        ghosts, ghost = self._ghosts, (node, tier, now)  # one record shared by the event's blocks
        for h in block_hashes:
            if h in ghosts:  # a new key goes in last; an old one must be moved there
                ghosts.move_to_end(h)
            ghosts[h] = ghost
        while len(ghosts) > self._s.max_ghosts:
            ghosts.popitem(last=False)

    def wanted(self, block_hashes: Sequence[int], now: float, recomputed_from: int = 0,
               routed_to: NodeId | None = None) -> int:
        """A route's chain at now, sent to routed_to, whose blocks from
        position recomputed_from on are computed again: counts its ghosts
        that are hits (module docstring) and forgets every ghost it names.
        Returns the hits."""
        ghosts, hits = self._ghosts, 0
        if not ghosts:
            return 0
        for i, h in enumerate(block_hashes):
            ghost = ghosts.get(h)
            if ghost is None:
                continue
            del ghosts[h]
            node, tier, when = ghost
            lost = i >= recomputed_from or (node == routed_to and tier is not Tier.DISK)
            if lost and now - when <= self._s.window_s:
                self._at(node, tier, now).hits += 1
                hits += 1
        return hits

    def p_reuse(self, node: NodeId, tier: Tier, now: float) -> float:
        """P(a block pushed out of node's tier now is wanted within window_s)."""
        s = self._s
        counts = self._counts.get((node, tier))
        hits, removed = (0.0, 0.0)
        if counts is not None:
            counts.decay(now, s.halflife_s)
            hits, removed = counts.hits, counts.removed
        return min(1.0, (hits + s.prior_weight * s.prior_p) / (removed + s.prior_weight))

    def removal_rate(self, node: NodeId, tier: Tier, now: float) -> float:
        """Blocks leaving node's tier per second, over the same decayed
        window as p_reuse (0.0 before anything left it). A constant rate r
        leaves r x h/ln 2 x (1 - 2^(-T/h)) decayed removals after T seconds
        of counting (h the half-life), so dividing by that weight is exact
        for a steady rate, however recently counting began."""
        counts = self._counts.get((node, tier))
        if counts is None:
            return 0.0
        halflife = self._s.halflife_s
        counts.decay(now, halflife)
        elapsed = now - counts.since
        if elapsed <= 0.0:
            return 0.0
        weight = halflife / math.log(2.0) * (1.0 - math.exp2(-elapsed / halflife))
        return counts.removed / weight

    def forget(self, node: NodeId) -> None:
        """A node that left or re-registered: its history is no longer its own."""
        for key in [k for k in self._counts if k[0] == node]:
            del self._counts[key]
        for h in [h for h, ghost in self._ghosts.items() if ghost[0] == node]:
            del self._ghosts[h]

    def _at(self, node: NodeId, tier: Tier, now: float) -> _Counts:
        counts = self._counts.get((node, tier))
        if counts is None:
            counts = self._counts[(node, tier)] = _Counts(at=now, since=now)
        counts.decay(now, self._s.halflife_s)
        return counts
