"""Routing: pick the node with the least expected time to first token.

KV-aware, load-aware router (the `none` policy's router, like Dynamo's KV
router or llm-d's precise prefix-cache scorer, plus on-demand pulls as in
llm-d P2P / Mooncake's conductor), priced over both memory tiers. For a
request of P prompt tokens whose chain of full blocks is h_1..h_B (block
size S), and each live node n:

  c_n       = longest prefix of h_1..h_B that n holds in either tier, blocks
  u_n       = how many of those n holds below its device tier alone (host
              or disk), and d_n of those the ones only its disk holds
  queue_n   = ms_per_token * (queued tokens reported + routed since the last
              heartbeat) + overhead_ms * (waiting requests + routed since)
  promote_n = host_link.transfer_ms(u_n * bytes_per_block), 0 when u_n = 0:
              host hits are copied into the device tier before prefill
              + disk.transfer_ms(d_n * bytes_per_block), 0 when d_n = 0:
              a disk load is read into the host tier first (bytes over the
              disk's GB/s plus its per-load overhead), then copied up,
              + diskwait_n when d_n > 0: the reads already booked on n's
              disk (disk_backlog.py), FIFO before this one; or, when a
              stage in flight on n reads this very prefix, the read is that
              stage's: the disk term is its remaining time alone
  local_n   = promote_n + prefill_ms(new = P - c_n*S, cached = c_n*S), or,
              when d_n > 0 and it is strictly cheaper, prefill_ms(new = P,
              cached = 0): the node recomputes rather than load from its disk
              (the decision then names 0 cached blocks)
  fetch_n   = with H the live node holding the longest prefix c_H > c_n:
              max(wait_H, wait_n) + max(transfer_ms((c_H - c_n) * bytes_per_block),
                                        host_link.transfer_ms(min(u_H, c_H - c_n) * bytes_per_block)
                                        + disk.transfer_ms(min(d_H, c_H - c_n) * bytes_per_block))
              where wait_x is how long x's link is already spoken for by
              the pulls and orders the scheduler started (link_backlog.py);
              a pull from H's host tier streams through H's host link and the
              network at once, so the slower of the two bounds it
  pull_n    = max(promote_n, fetch_n) + prefill_ms(new = P - c_H*S, cached = c_H*S)
              (n's own host hits are promoted while the pull runs)
  TTFT_n    = queue_n + min(local_n, pull_n)

The prefill-ahead charge (`router.prefill_ahead_weight` w, 0: off): a
request that waits for a promotion or pull joins its node's engine queue
only when that ends, so a request routed after it that starts sooner goes
ahead of it. With chunked prefill (a budget of B tokens per engine step,
`router.prefill_ahead_budget_tokens`, vLLM's default 8,192) a prompt of N
new tokens holds the budget for its steps beyond the first, so a request
that joins behind it waits about prefill_n * max(0, N - B) / N. The choice
(not the request's own TTFT_n, which the decision reports) is made on

  TTFT_n + w * ahead_n * prefill_n * max(0, N_n - B) / N_n

with ahead_n how many requests already routed to n will join its queue
after this one would (their promotion or pull ends later than this
request's own, if any). So a long new prompt avoids a node whose routed
requests are still fetching their prefixes when another node costs it less
than the delay it would put on them (issue 45, the returning tail's largest
class; docs/planner.md); a prompt within one step's budget is not charged.

The pull is chosen only when pull_n < local_n (strictly cheaper); the
response then names H and c_H - c_n blocks. Recomputing is local_n of a node
with c_n = 0. Cached tokens are capped at P - 1 because the engine always
computes the last prompt token. With no host link (a cluster without host
tiers) u_n is 0 everywhere and the figures are the one-tier ones; with no
disk (or d_n = 0 everywhere) they are the two-tier ones. So each node is
priced at the cheapest of its device hits, host hits, disk loads, a peer
pull and (beside the other nodes' recompute) its own recompute.

Spreading: nodes within `tie_ms` (default 1 ms) of the best TTFT tie; among
them the one with the fewest routes in flight (routed since its last
heartbeat) wins, then a seeded RNG picks. The caller adds each routed
request's uncached tokens to the node's pending load, so a burst between two
heartbeats sees its own queue build up and spreads instead of piling on the
first winner.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol, Sequence

from speckv.services.common.engine_profile import EngineProfile, LinkModel
from speckv.services.common.ids import Family, NodeId


@dataclass(slots=True)
class RouteQuery:
    request_id: str
    block_hashes: list[int]
    prompt_tokens: int
    family: Family


@dataclass(slots=True)
class Candidate:
    """A live node as the router sees it."""

    node_id: NodeId
    routes_in_flight: int
    cached_blocks: int
    block_size: int
    bytes_per_block: int
    queue_ms: float  # expected wait before its prefill starts (Cluster.queue_ms)
    link_wait_ms: float = 0.0  # until its link has carried the transfers already booked on it (LinkBacklog)
    host_blocks: int = 0  # of cached_blocks, those only its host (or disk) tier holds
    disk_blocks: int = 0  # of host_blocks, those only its disk tier holds
    # Before its disk read starts (DiskBacklog): the reads already booked on its disk, or, when
    # disk_joined, until a stage in flight that reads these very blocks lands (the read is then that one).
    disk_wait_ms: float = 0.0
    disk_joined: bool = False
    # ms from now until each request routed here that waits for a promotion or pull joins its engine's queue
    entering_ms: tuple[float, ...] = ()


@dataclass(slots=True)
class RouteDecision:
    node_id: NodeId
    cached_blocks: int
    expected_ttft_ms: float
    queue_ms: float
    prefill_ms: float
    fetch_ms: float = 0.0
    fetch_from: NodeId | None = None
    fetch_blocks: int = 0
    promote_ms: float = 0.0
    promote_blocks: int = 0  # host-tier hits of the chosen node, copied to its device tier before prefill
    disk_blocks: int = 0  # of promote_blocks, those read from its disk tier first
    disk_joined: bool = False  # those come with a stage in flight there, not a read of their own


# (prefill ms, ms before prefill: promotion and pull, blocks to pull, promote ms,
#  cached blocks used: the node's cached_blocks, or 0 when it recomputes rather than load from disk)
Figures = tuple[float, float, int, float, int]
MemoKey = tuple[int, int, int, float, int, int, float, bool]


class RoutingStrategy(Protocol):
    name: str

    def choose(self, query: RouteQuery, candidates: Sequence[Candidate]) -> RouteDecision:
        """Picks one of candidates (non-empty, all live)."""
        ...

    def estimate(self, query: RouteQuery, node: Candidate, holder: Candidate | None) -> RouteDecision:
        """The decision for routing query to node, pulling from holder if cheaper."""
        ...


class KvAwareRouter:
    name = "kv-aware"

    def __init__(self, profile: EngineProfile, link: LinkModel, seed: int = 0, tie_ms: float = 1.0,
                 host_link: LinkModel | None = None, disk: LinkModel | None = None,
                 prefill_ahead_weight: float = 0.0, prefill_ahead_budget_tokens: int = 8192) -> None:
        """host_link: the host<->device link of every node (None: no host
        tiers); disk: every node's disk reads as a link (None: disk blocks
        are priced as host hits, as before disks were priced);
        prefill_ahead_weight, prefill_ahead_budget_tokens: w and B of the
        prefill-ahead charge (0: off)."""
        self._profile = profile
        self._ahead_weight = prefill_ahead_weight
        self._ahead_budget = prefill_ahead_budget_tokens
        self._link = link
        self._host_link = host_link
        self._disk = disk
        self._rng = random.Random(seed)
        self._tie_ms = tie_ms

    def choose(self, query: RouteQuery, candidates: Sequence[Candidate]) -> RouteDecision:
        if not candidates:
            raise ValueError("no candidates")
        holder = best_holder(candidates)
        memo: dict[MemoKey, Figures] = {}
        # Scores are plain floats (the same arithmetic as _estimate, in the
        # same order, so the same values); only the winner becomes a
        # RouteDecision: this loop runs for every candidate of every route.
        holder_id = holder.node_id if holder is not None else None
        holder_blocks = holder.cached_blocks if holder is not None else 0
        scores: list[float] = []
        for c in candidates:
            pulls = holder_id is not None and holder_id != c.node_id and holder_blocks > c.cached_blocks
            # _memo_figures, inlined (the same key and figures): one call less per candidate
            key = (c.cached_blocks, c.block_size, c.bytes_per_block if pulls or c.host_blocks else -1,
                   c.link_wait_ms if pulls else 0.0, c.host_blocks, c.disk_blocks, c.disk_wait_ms, c.disk_joined)
            figures = memo.get(key)
            if figures is None:
                figures = memo[key] = self._figures(query, c, holder if pulls else None)
            score = c.queue_ms + figures[1] + figures[0] if figures[1] else c.queue_ms + figures[0]
            if c.entering_ms and self._ahead_weight:
                score += self._ahead_charge(query, c, figures, holder_blocks)
            scores.append(score)
        limit = min(scores) + self._tie_ms
        tied = [c for c, score in zip(candidates, scores) if score <= limit]
        if len(tied) > 1:
            fewest = min(c.routes_in_flight for c in tied)
            tied = sorted((c for c in tied if c.routes_in_flight == fewest), key=lambda c: c.node_id)
        return self._estimate(query, self._rng.choice(tied), holder, memo)  # drawn even from one: same RNG stream

    def estimate(self, query: RouteQuery, node: Candidate, holder: Candidate | None) -> RouteDecision:
        return self._estimate(query, node, holder, {})

    def _ahead_charge(self, query: RouteQuery, node: Candidate, figures: Figures, holder_blocks: int) -> float:
        """w x (requests routed to node that would join its queue after this
        one) x the part of this one's prefill beyond one step's budget."""
        jumped = sum(1 for ms in node.entering_ms if ms > figures[1])
        if not jumped:
            return 0.0
        cached_blocks = holder_blocks if figures[2] else figures[4]
        new = query.prompt_tokens - min(cached_blocks * node.block_size, query.prompt_tokens - 1)
        if new <= self._ahead_budget:
            return 0.0
        return self._ahead_weight * jumped * figures[0] * (new - self._ahead_budget) / new

    def _estimate(self, query: RouteQuery, node: Candidate, holder: Candidate | None,
                  memo: dict[MemoKey, Figures]) -> RouteDecision:
        """The decision for node; memo shares the figures between candidates
        with the same cached prefix (most non-holders: none)."""
        queue_ms = node.queue_ms
        pulls = holder is not None and holder.node_id != node.node_id and holder.cached_blocks > node.cached_blocks
        prefill_ms, before_ms, missing, promote_ms, used = self._memo_figures(query, node, holder if pulls else None,
                                                                             memo)
        promoted = node.host_blocks if promote_ms else 0
        from_disk = node.disk_blocks if promote_ms else 0
        expected = queue_ms + before_ms + prefill_ms if before_ms else queue_ms + prefill_ms
        if missing:
            assert holder is not None
            fetch_ms = self._fetch_ms(node, holder)
            return RouteDecision(node.node_id, node.cached_blocks, expected, queue_ms, prefill_ms, fetch_ms,
                                 holder.node_id, missing, promote_ms, promoted, from_disk,
                                 bool(from_disk) and node.disk_joined)
        return RouteDecision(node.node_id, used, expected, queue_ms, prefill_ms,
                             promote_ms=promote_ms, promote_blocks=promoted, disk_blocks=from_disk,
                             disk_joined=bool(from_disk) and node.disk_joined)

    def _memo_figures(self, query: RouteQuery, node: Candidate, holder: Candidate | None,
                      memo: dict[MemoKey, Figures]) -> Figures:
        pulls = holder is not None
        key = (node.cached_blocks, node.block_size, node.bytes_per_block if pulls or node.host_blocks else -1,
               node.link_wait_ms if pulls else 0.0, node.host_blocks, node.disk_blocks, node.disk_wait_ms,
               node.disk_joined)
        figures = memo.get(key)
        if figures is None:
            figures = memo[key] = self._figures(query, node, holder)
        return figures

    def _figures(self, query: RouteQuery, node: Candidate, holder: Candidate | None) -> Figures:
        """Pull only when strictly cheaper than prefilling from what node
        holds; recompute rather than load from disk only when strictly cheaper."""
        promote_ms = self._own_below_ms(node)
        local_ms = self._prefill(query, node.cached_blocks, node.block_size)
        used = node.cached_blocks
        if node.disk_blocks and self._disk is not None:
            scratch_ms = self._prefill(query, 0, node.block_size)
            if scratch_ms < promote_ms + local_ms:
                local_ms, promote_ms, used = scratch_ms, 0.0, 0
        if holder is None:
            return local_ms, promote_ms, 0, promote_ms, used
        missing = holder.cached_blocks - node.cached_blocks
        own_ms = self._own_below_ms(node)
        before_ms = max(own_ms, self._fetch_ms(node, holder))
        after_ms = self._prefill(query, holder.cached_blocks, node.block_size)
        if before_ms + after_ms < (promote_ms + local_ms if promote_ms else local_ms):
            return after_ms, before_ms, missing, own_ms, node.cached_blocks
        return local_ms, promote_ms, 0, promote_ms, used

    def _fetch_ms(self, node: Candidate, holder: Candidate) -> float:
        """Moving holder's blocks beyond node's prefix into node (link backlog included)."""
        missing = holder.cached_blocks - node.cached_blocks
        wire_ms = self._link.transfer_ms(missing * node.bytes_per_block)
        source_ms = self._below_ms(min(holder.host_blocks, missing), min(holder.disk_blocks, missing),
                                   node.bytes_per_block)
        return max(holder.link_wait_ms, node.link_wait_ms) + max(wire_ms, source_ms)

    def _own_below_ms(self, node: Candidate) -> float:
        """Bringing node's own blocks below its device tier up: its disk
        read waits for the reads booked on its disk first, or, joining a
        stage in flight that reads them, is that stage's remaining time."""
        if not node.disk_blocks or self._disk is None or self._host_link is None or node.host_blocks <= 0:
            return self._below_ms(node.host_blocks, node.disk_blocks, node.bytes_per_block)
        if node.disk_joined:
            return self._host_link.transfer_ms(node.host_blocks * node.bytes_per_block) + node.disk_wait_ms
        return self._below_ms(node.host_blocks, node.disk_blocks, node.bytes_per_block) + node.disk_wait_ms

    def _below_ms(self, blocks: int, disk_blocks: int, bytes_per_block: int) -> float:
        """Bringing blocks held below the device tier up to it, disk_blocks
        of them read from the disk into the host tier first."""
        if blocks <= 0 or self._host_link is None:
            return 0.0
        ms = self._host_link.transfer_ms(blocks * bytes_per_block)
        if disk_blocks > 0 and self._disk is not None:
            ms += self._disk.transfer_ms(disk_blocks * bytes_per_block)
        return ms

    def _prefill(self, query: RouteQuery, cached_blocks: int, block_size: int) -> float:
        cached = min(cached_blocks * block_size, query.prompt_tokens - 1)
        return self._profile.prefill_ms(query.prompt_tokens - cached, cached)


def best_holder(candidates: Sequence[Candidate]) -> Candidate | None:
    """The candidate with the longest cached prefix (ties: the fewest blocks
    in its host tier alone, whose host link would slow a pull; then least
    busy; then id)."""
    best, top, tie = None, 0, False
    for c in candidates:  # one pass: the route's hot path calls this twice per request
        blocks = c.cached_blocks
        if blocks > top:
            best, top, tie = c, blocks, False
        elif blocks == top and best is not None:
            tie = True
    if best is None or not tie:
        return best
    # Only the longest-prefix holders can win: tie-break among them alone.
    holders = [c for c in candidates if c.cached_blocks == top]
    return min(holders, key=lambda c: (c.host_blocks, c.queue_ms, c.node_id))


def uncached_tokens(decision: RouteDecision, query: RouteQuery, block_size: int) -> int:
    """Tokens the chosen node must prefill (its pending load until the next heartbeat)."""
    cached_blocks = decision.cached_blocks + decision.fetch_blocks
    return max(1, query.prompt_tokens - min(cached_blocks * block_size, query.prompt_tokens - 1))

def longer_holder(candidates: Sequence[Candidate], decision: RouteDecision) -> NodeId | None:
    """A node holding a longer prefix than the one routed to: the request
    could have pulled from it (whether it did or not), so it wants that link."""
    holder = best_holder(candidates)
    if holder is None or holder.node_id == decision.node_id or holder.cached_blocks <= decision.cached_blocks:
        return None
    return holder.node_id
