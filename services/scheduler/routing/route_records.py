"""What a Route takes and gives: the request items of a batched route, the
validated query, the router's pick and the result the servicer packs.

A query is valid when prompt_tokens > 0, there are no more block hashes than
prompt tokens (a full block holds at least one token) and arrival_time_s >= 0
(0: the scheduler's clock).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import UINT64_MAX, Family, NodeId, default_family
from speckv.services.scheduler.routing.observation import RouteObservation
from speckv.services.scheduler.routing.router import Candidate, RouteDecision, RouteQuery


@dataclass(frozen=True, slots=True)
class RouteRequestItem:
    """One request of a batched route (mirrors RouteRequest)."""

    request_id: str
    block_hashes: Sequence[int]
    prompt_tokens: int
    family: str = ""
    arrival_time_s: float = 0.0


@dataclass(slots=True)
class RouteResult:
    node_id: NodeId
    address: str
    cached_blocks: int
    expected_ttft_ms: float
    queue_ms: float
    prefill_ms: float
    fetch_ms: float
    fetch_from: NodeId | None
    fetch_blocks: int
    family: Family
    confirmed: bool
    promote_ms: float = 0.0
    promote_blocks: int = 0  # host-tier hits on node_id, promoted to its device tier before prefill
    # What this route changed in the planner's picture (applied under the lock, before
    # confirmation), for a peer replica's SchedulerCore.observe_routes; None: not a local route.
    observation: RouteObservation | None = None
    disk_blocks: int = 0  # of promote_blocks, those node_id reads off its disk tier first


@dataclass(slots=True)
class PickedRoute:
    """What the router chose under the lock, kept for the confirmation and the
    result built outside it."""

    decision: RouteDecision
    candidates: list[Candidate]
    address: str
    block_size: int
    observation: RouteObservation | None = None


def route_query(request_id: str, block_hashes: Sequence[int], prompt_tokens: int, family: str,
                arrival_time_s: float) -> RouteQuery:
    """A validated query; InvalidArgument names what is wrong."""
    hashes = list(block_hashes)
    validate_route(hashes, prompt_tokens)
    if not arrival_time_s >= 0:
        raise InvalidArgument(f"arrival_time_s={arrival_time_s}: must be >= 0 (0: the scheduler's clock)")
    return RouteQuery(request_id, hashes, prompt_tokens, Family(family) if family else default_family(hashes))


def validate_route(hashes: list[int], prompt_tokens: int) -> None:
    if prompt_tokens <= 0:
        raise InvalidArgument(f"prompt_tokens={prompt_tokens}: must be > 0")
    if len(hashes) > prompt_tokens:
        raise InvalidArgument(f"{len(hashes)} block hashes for prompt_tokens={prompt_tokens}: "
                              "a full block holds at least one token")
    if len(set(hashes)) != len(hashes):
        raise InvalidArgument("block_hashes repeats a hash; a chained prefix never does")
    if hashes and (min(hashes) < 0 or max(hashes) > UINT64_MAX):  # C loops: this runs for every routed request
        raise InvalidArgument("block_hashes: hashes are uint64")
