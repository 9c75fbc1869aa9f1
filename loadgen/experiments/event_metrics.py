"""What a node event did to the requests it touched (issue 27's event
metrics), from request records alone.

The *affected* requests of a kill are those whose prompt holds a block the
lost node alone held when it died, KV the loss destroyed (arriving in the
window before it, they made or used that KV; after it, they would have
reused it): with conversations, one
family's root is shared by thousands of sessions, so blocks, not families,
say whom a loss touches. The simulation marks them (membership.py). Without
marks, and for an add, they are the requests of the affected families: a
kill's families whose chain roots the node held; an add's, the families the
new node served in the window after it joined.
- affected_ttft_p99_before_ms / _after_ms: p99 TTFT of the affected
  requests arriving in the WINDOW_S before / after the event (served ones;
  None with none).
- recovery_s: seconds from the event to the start of the first
  RECOVERY_WINDOW_S window (stepping 1 s) whose affected p99 is within
  RECOVERY_TOLERANCE of the before figure; None when no window in the run
  recovers or there is no before figure.
- For an add: new_node_fair_share (requests routed to the new node in the
  window after, over the window's requests per alive node) and its prefix
  hit ratio beside the cluster's in the same window; with the run's
  reusable-token figures (ttft_floor.py), also the share of its requests
  that were returning and its reuse recovered beside the cluster's: a node
  given first-seen requests misses wherever it is, so the hit ratio alone
  cannot say whether it was cold. Also how many of its requests in the
  window read a speculative replica (new_node_replica_hits), and, where the
  run counts them (the simulator), the orders that targeted it in that
  window (prewarm_orders).
Counts the simulation measures itself (requests re-sent, lost, tokens
recomputed) are passed through. Pure.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from speckv.loadgen.experiments.metrics import RequestRecord, percentile, reuse_figures

WINDOW_S = 60.0
RECOVERY_WINDOW_S = 10.0
RECOVERY_TOLERANCE = 0.10
MIN_WINDOW_REQUESTS = 3  # fewer affected requests in a recovery window say nothing about its p99


@dataclass(slots=True)
class EventOutcome:
    """What the run measured about one event."""

    kind: str  # "kill" or "add"
    at_s: float
    node: str
    families: frozenset[str] = frozenset()
    affected_requests: set[str] = field(default_factory=set)  # request ids; empty: go by families
    requests_resent: int = 0
    requests_lost: int = 0
    recompute_tokens: int = 0
    alive_nodes_after: int = 0
    prewarm_orders: int | None = None  # orders targeting an added node in the window after it joined; None: not counted


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _p99(records: Sequence[RequestRecord]) -> float | None:
    return percentile([r.ttft_ms for r in records if r.served and r.ttft_ms is not None], 99)


def _hit_ratio(records: Sequence[RequestRecord]) -> float | None:
    served = [r for r in records if r.served]
    prompt = sum(r.prompt_tokens for r in served)
    return sum(r.cached_tokens + r.fetched_tokens for r in served) / prompt if prompt else None


def _recovery_s(affected: Sequence[RequestRecord], at_s: float, before: float | None) -> float | None:
    if before is None or not affected:
        return None
    end = max(r.arrival_s for r in affected)
    for k in range(int(math.ceil(end - at_s)) + 1):
        lo = at_s + k
        window = [r for r in affected if lo <= r.arrival_s < lo + RECOVERY_WINDOW_S]
        p99 = _p99(window)
        if len(window) >= MIN_WINDOW_REQUESTS and p99 is not None and p99 <= before * (1 + RECOVERY_TOLERANCE):
            return float(k)
    return None


@dataclass(slots=True)
class EventFigures:
    kind: str
    at_s: float
    node: str
    affected_families: int
    affected_requests_before: int
    affected_requests_after: int
    affected_ttft_p99_before_ms: float | None
    affected_ttft_p99_after_ms: float | None
    recovery_s: float | None
    recompute_tokens: int
    requests_resent: int
    requests_lost: int
    scale_out: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def event_figures(records: Sequence[RequestRecord], event: EventOutcome,
                  reusable_tokens: Mapping[str, int] | None = None,
                  shared_tokens: Mapping[str, int] | None = None) -> EventFigures:
    """reusable_tokens / shared_tokens: request id -> tokens (metrics.summarize's)."""
    at = event.at_s
    if event.kind == "add":
        joined = [r for r in records if r.node_id == event.node and at <= r.arrival_s < at + WINDOW_S]
        families = frozenset(r.family for r in joined)
    else:
        families = event.families
    marked = event.affected_requests
    affected = ([r for r in records if r.request_id in marked] if marked
                else [r for r in records if r.family in families])
    before = [r for r in affected if at - WINDOW_S <= r.arrival_s < at]
    after = [r for r in affected if at <= r.arrival_s < at + WINDOW_S]
    p99_before = _p99(before)
    figures = EventFigures(event.kind, at, event.node, len(families), len(before), len(after), p99_before,
                           _p99(after), _recovery_s([r for r in affected if r.arrival_s >= at], at, p99_before),
                           event.recompute_tokens, event.requests_resent, event.requests_lost)
    if event.kind == "add":
        window = [r for r in records if at <= r.arrival_s < at + WINDOW_S]
        fair = len(window) / event.alive_nodes_after if event.alive_nodes_after else 0.0
        mine = [r for r in window if r.node_id == event.node]
        figures.scale_out = {"new_node_requests": float(len(mine)),
                             "new_node_fair_share": len(mine) / fair if fair else None,
                             "new_node_prefix_hit_ratio": _hit_ratio(mine),
                             "cluster_prefix_hit_ratio": _hit_ratio(window),
                             "new_node_replica_hits": float(sum(1 for r in mine if r.replica_blocks > 0)),
                             "prewarm_orders": (float(event.prewarm_orders) if event.prewarm_orders is not None
                                                else None)}
        if reusable_tokens is not None and shared_tokens is not None:
            node_reuse = reuse_figures([r for r in mine if r.served], reusable_tokens, shared_tokens)
            cluster_reuse = reuse_figures([r for r in window if r.served], reusable_tokens, shared_tokens)
            returning = node_reuse.get("returning_requests")
            figures.scale_out.update({
                "new_node_returning_share": float(returning) / len(mine) if mine and returning is not None else None,
                "new_node_reuse_recovered": _float(node_reuse.get("reuse_recovered_ratio")),
                "cluster_reuse_recovered": _float(cluster_reuse.get("reuse_recovered_ratio"))})
    return figures
