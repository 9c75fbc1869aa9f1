"""Policy `affinity`: llm-d's burst prefix-cache affinity, copy-free.

llm-d's burst-prefix-cache-producer (llm-d/llm-d-router PR #1727; PR #1978
added balanceBy) co-locates the prefix-sharing requests of a batch window on
one replica, under a per-replica fair share, so a shared prefix is prefilled
once while no cache is warm yet. It moves no KV: it only changes where
requests go, so this policy plans no orders (plan() is always empty) and acts
through the router's routing hook (routing/preference.py).

The streaming form of llm-d's window (Route answers at once; llm-d holds a
request up to the window and places the sealed batch): a window opens at the
first route after the previous one closed and lasts `affinity.window_ms`
(llm-d's windowDurationMs, default 100 ms). Within it, for a request whose
chain of full blocks is h_1..h_B:

1. Identical group: a request whose whole chain equals one already routed in
   the window follows it to the first node of that group holding fewer than
   `max_per_replica` of the group's requests (llm-d's maxPerReplica, default
   -1: no cap, the whole group on one node). Every such node full: the spill
   (below), and the group then follows that node too.
2. Prefix sharing (`min_colocate_tokens` > 0, llm-d's minColocateBlocks in
   tokens: m = ceil(min_colocate_tokens / block size) blocks): a node's run
   is the longest h_1..h_r that a request of this window routed to it
   carried. Among the nodes with a run of at least m blocks and still under
   their fair share, ceil(requests routed in the window, this one included,
   / live nodes), the longest run wins (ties: fewer requests of the window,
   then node id). None qualifies: the spill.
   The spill (`affinity.spill`): `router`, committed, leaves the request to
   the router; `least_loaded` is llm-d's, the scored candidate with the
   fewest requests of the window (ties: the shorter queue, then node id).
3. Otherwise (the window's first request, no prefix, no match) the router's
   choice, the least expected TTFT, as under `none`: llm-d's other scorers.

Every route, whoever chose its node, is recorded in the window, so later
requests follow the placements the router made. The fair share is counted
over the window so far (llm-d's: over the sealed window, the same at its
end), among requests with at least one full block. Not modelled: balanceBy
`tokens` (PR #1978's opt-in; `requests` is llm-d's default) and the wait in
the window (no request waits here, so this is kinder to TTFT than llm-d by
up to window_ms). A scheduler replica that does not answer a route (a peer's,
applied through observe_routes) does not see it in its window. Thresholds: the
`affinity` section of services/config/policies.json, with its sources.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from speckv.services.common.ids import NodeId
from speckv.services.scheduler.orders import OrderSpec
from speckv.services.scheduler.policy_config import AffinitySettings
from speckv.services.scheduler.routing.router import Candidate, RouteQuery
from speckv.services.scheduler.views import ClusterView

GroupKey = tuple[int, int]  # (last block hash, blocks): the whole chain, hashes being chained


class BurstWindow:
    """The batch window and the placements made in it (routing/preference.py's
    RoutePreference). State is bounded by the routes of one window; every
    walk is in insertion or node-id order (no set order, no hash seed)."""

    def __init__(self, settings: AffinitySettings) -> None:
        self._window_s = settings.window_ms / 1000.0
        self._k = settings.max_per_replica
        self._min_tokens = settings.min_colocate_tokens
        self._spill_mode = settings.spill
        self._opened: float | None = None  # when the open window began (s); None: no window open
        self._total = 0  # requests with a prefix routed in the window
        self._load: dict[NodeId, int] = {}  # node -> those of them routed to it
        self._holders: dict[int, dict[NodeId, None]] = {}  # block hash -> nodes a request carrying it went to
        self._groups: dict[GroupKey, dict[NodeId, int]] = {}  # whole chain -> node -> its requests there

    def preferred(self, query: RouteQuery, candidates: Sequence[Candidate], now: float,
                  live_count: Callable[[], int]) -> NodeId | None:
        hashes = query.block_hashes
        self._roll(now)
        if not hashes or self._opened is None:
            return None
        group = self._groups.get((hashes[-1], len(hashes)))
        if group:
            node = next((node for node, n in group.items() if self._k < 0 or n < self._k), None)
            return node if node is not None else self._spill(candidates)
        block_size = candidates[0].block_size if candidates else 0
        if self._min_tokens <= 0 or block_size <= 0:
            return None
        need = math.ceil(self._min_tokens / block_size)
        runs = {node: run for node, run in self._runs(hashes).items() if run >= need} if len(hashes) >= need else {}
        if not runs:
            return None  # shares no prefix with the window: no affinity, the router decides
        share = math.ceil((self._total + 1) / max(1, live_count()))
        best: tuple[int, int, NodeId] | None = None
        for node, run in runs.items():
            load = self._load.get(node, 0)
            if load < share and (best is None or (-run, load, node) < best):
                best = (-run, load, node)
        return best[2] if best is not None else self._spill(candidates)

    def _spill(self, candidates: Sequence[Candidate]) -> NodeId | None:
        """Where a request with affinity goes when its nodes are full: the
        router's choice ("router"), or llm-d's least window-loaded node (ties:
        the shorter queue, then node id) among the scored candidates."""
        if self._spill_mode == "router" or not candidates:
            return None
        return min(candidates, key=lambda c: (self._load.get(c.node_id, 0), c.queue_ms, c.node_id)).node_id

    def routed(self, query: RouteQuery, node_id: NodeId, now: float) -> None:
        hashes = query.block_hashes
        self._roll(now)
        if not hashes:
            return
        if self._opened is None:
            self._opened = now
        self._total += 1
        self._load[node_id] = self._load.get(node_id, 0) + 1
        for h in hashes:
            self._holders.setdefault(h, {})[node_id] = None
        group = self._groups.setdefault((hashes[-1], len(hashes)), {})
        group[node_id] = group.get(node_id, 0) + 1

    def _runs(self, hashes: list[int]) -> dict[NodeId, int]:
        """node -> how many of hashes' leading blocks a request routed to it
        in this window carried (chained hashes: holding h_i means h_1..h_i)."""
        runs: dict[NodeId, int] = {}
        for i, h in enumerate(hashes):
            nodes = self._holders.get(h)
            if not nodes:
                break
            for node in nodes:
                runs[node] = i + 1
        return runs

    def _roll(self, now: float) -> None:
        """Closes the open window once window_s has passed since it opened."""
        if self._opened is not None and now >= self._opened + self._window_s:
            self._opened, self._total = None, 0
            self._load.clear()
            self._holders.clear()
            self._groups.clear()


class AffinityPolicy:
    name = "affinity"
    description = ("llm-d's burst prefix-cache affinity: requests sharing a prompt prefix within a batch window "
                   "are co-located on one node under a per-node fair share of the window; a routing "
                   "decision only (emits no orders).")
    needs_view = False  # plan() reads nothing

    def __init__(self, settings: AffinitySettings) -> None:
        self.route_preference = BurstWindow(settings)

    def prepare(self, now: float) -> None:
        return None

    def plan(self, now: float, view: ClusterView | None) -> list[OrderSpec]:
        return []
