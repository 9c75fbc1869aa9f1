"""A policy's say in where Route sends a request: the routing hook.

Policies act through orders (copies) by default and leave every route to the
shared router (router.py, the least expected TTFT). A policy that places
requests instead (`affinity`, policies/affinity.py) exposes a
`route_preference` attribute with this module's RoutePreference interface;
a policy without one (every other policy) is routed exactly as before: the
router's choice over the same candidates, the same RNG draws, so their
figures stay bit-identical.

With a preference, each route asks it first, under the scheduler's lock:

- `preferred(query, candidates, now, live_count)` names a node (or None: the
  router decides). A named node that is not among the scored candidates is
  added as one (CandidateSelector.candidate) when it is live; a named node
  that is not live is ignored and the router decides. The request then goes
  to that node with the router's own estimate for it (its cached prefix,
  promotion and pull, as if the router had picked it).
- `routed(query, node_id, now)` is told where every route went, whoever
  chose it, so the preference can follow the placements it did not make.

Its time is the request's arrival (RouteRequest.arrival_time_s, capped at
the clock; the clock when none is given), not the route's: the simulator's
warm start routes minutes of history at one clock instant, each request at
its own arrival. `live_count` is a callable (the number of live nodes,
counted only when the preference asks for it). The preference must be quick
and do no I/O; it takes time only from its arguments.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from speckv.services.common.ids import NodeId
from speckv.services.scheduler.routing.candidates import CandidateSelector
from speckv.services.scheduler.routing.router import Candidate, KvAwareRouter, RouteDecision, RouteQuery, best_holder


class RoutePreference(Protocol):
    def preferred(self, query: RouteQuery, candidates: Sequence[Candidate], now: float,
                  live_count: Callable[[], int]) -> NodeId | None:
        """The node query should go to, or None to leave it to the router."""
        ...

    def routed(self, query: RouteQuery, node_id: NodeId, now: float) -> None:
        """query was routed to node_id at now (by the preference or the router)."""
        ...


def preference_of(policy: object) -> RoutePreference | None:
    """The policy's routing hook, None for a policy that only plans orders."""
    return getattr(policy, "route_preference", None)


def decide(policy: object, router: KvAwareRouter, selector: CandidateSelector, query: RouteQuery,
           candidates: list[Candidate], now: float, arrival_s: float,
           live_count: Callable[[], int]) -> tuple[RouteDecision, list[Candidate]]:
    """The route's decision and the candidates it was scored over (the
    preferred node appended when it was not among them). now: the clock,
    for the candidates; arrival_s (<= now): when the request came, the
    preference's time."""
    hook = preference_of(policy)
    if hook is None:
        return router.choose(query, candidates), candidates
    node = hook.preferred(query, candidates, arrival_s, live_count)
    chosen = None
    if node is not None:
        chosen = next((c for c in candidates if c.node_id == node), None)
        if chosen is None:
            extra = selector.candidate(node, query.block_hashes, now)
            if extra is not None:
                candidates, chosen = [*candidates, extra], extra
    if chosen is None:
        decision = router.choose(query, candidates)
    else:
        decision = router.estimate(query, chosen, best_holder(candidates))
    hook.routed(query, decision.node_id, arrival_s)
    return decision, candidates
