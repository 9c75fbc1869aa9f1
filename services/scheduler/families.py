"""What the scheduler learns about each prefix family from the requests it
routes: the chain of blocks the family's requests share, their mean prompt
length, and their heat (routes within a sliding window, per family and per
family-on-node).

- chain: the blocks the family's next request is expected to start with,
  capped at `max_chain_blocks`; it is what a replica of the family copies. A
  request that continues the chain (a conversation's next turn repeats the
  whole previous prompt) extends it to that request's chain, until two
  requests diverge; from then on the chain is the common prefix (a shared
  template with different suffixes) and only ever shrinks. Copying only the common prefix of a conversation would copy its
  first turn, which the original holder beats with the longer prefix.
- prompt_tokens: exponentially weighted mean, weight `prompt_ewma_alpha` on
  the newest request.
- heat: one window of `heat_window_s` seconds over every route, kept as a
  deque plus counters, so `observe` and the `hot()` query are O(1) amortised
  per route and never scan the families that were quiet in the window.
- recent routes: a second, short window of `recent_window_s` seconds kept the
  same way (`surging()`): the rate a burst is arriving at now, which a
  count forecast smoothed over seconds reports only after the burst's start.
- surge history: a family *surges* while its recent routes are at least
  `surge_min_routes`; each profile counts its surges, the sum of their peaks
  (most recent routes at once) and the time of its first recent route
  (`surge_history`), so the planner can price a standing copy against the
  family's next surge (replication/insurance.py).

Bounded: at most `max_families` profiles; the least recently routed one is
forgotten first. Not thread-safe: SchedulerCore serialises access. Times are
clock seconds.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Sequence

from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.policy_config import FamilySettings


@dataclass(slots=True)
class FamilyProfile:
    chain: list[int]
    prompt_tokens: float
    routes: int = 0
    last_route: float = 0.0
    diverged: bool = False  # two requests disagreed: the chain is a shared prefix, never extended again
    first_recent: float | None = None  # the first route counted in the recent window (a live arrival)
    surges: int = 0  # times its recent routes reached surge_min_routes from below
    surge_peaks: int = 0  # sum of the peaks of its finished surges (routes within recent_window_s)
    peak: int = 0  # the peak of the surge it is in; 0 when not surging


@dataclass(frozen=True, slots=True)
class SurgeHistory:
    surges: int
    mean_peak: float  # routes within recent_window_s at a surge's peak, mean over its surges
    observed_s: float  # since its first route counted in the recent window
    surging: bool  # in a surge now


class FamilyCatalog:
    def __init__(self, settings: FamilySettings) -> None:
        self._s = settings
        self._profiles: OrderedDict[Family, FamilyProfile] = OrderedDict()
        self._window: deque[tuple[float, Family, NodeId]] = deque()
        # Plain dicts, not Counters: a Counter's missing key is a Python-level
        # __missing__ call, and every route counts a key that is often new.
        self._heat: dict[Family, int] = {}
        self._node_heat: dict[tuple[Family, NodeId], int] = {}
        self._node_routes: dict[NodeId, int] = {}  # routes to each node within the window
        self._recent_window: deque[tuple[float, Family]] = deque()
        self._recent: dict[Family, int] = {}  # routes of each family within recent_window_s

    def observe(self, family: Family, hashes: Sequence[int], prompt_tokens: int, node: NodeId, now: float,
                arrival_s: float | None = None) -> None:
        """A route at now of a request that arrived at arrival_s (<= now; None:
        now). Only a request that arrived within the recent window counts
        there: a warm start routes hours of history within a second, which
        is no burst."""
        profile = self._profiles.get(family)
        if profile is None:
            profile = FamilyProfile(list(hashes[: self._s.max_chain_blocks]), float(prompt_tokens))
            self._profiles[family] = profile
            if len(self._profiles) > self._s.max_families:
                self._profiles.popitem(last=False)
        else:
            self._profiles.move_to_end(family)
            profile.diverged = _follow_chain(profile.chain, hashes, self._s.max_chain_blocks, profile.diverged)
            a = self._s.prompt_ewma_alpha
            profile.prompt_tokens += a * (prompt_tokens - profile.prompt_tokens)
        profile.routes += 1
        profile.last_route = now
        self._window.append((now, family, node))
        heat, node_heat, key = self._heat, self._node_heat, (family, node)
        heat[family] = heat.get(family, 0) + 1
        node_heat[key] = node_heat.get(key, 0) + 1
        self._node_routes[node] = self._node_routes.get(node, 0) + 1
        self._expire(now)  # before counting: a surge's onset is judged on the window ending now
        if arrival_s is None or arrival_s > now - self._s.recent_window_s:
            self._recent_window.append((now, family))
            recent = self._recent[family] = self._recent.get(family, 0) + 1
            if profile.first_recent is None:
                profile.first_recent = now
            if profile.peak:
                profile.peak = max(profile.peak, recent)
            elif recent >= self._s.surge_min_routes:
                profile.surges += 1
                profile.peak = recent

    def profile(self, family: Family) -> FamilyProfile | None:
        return self._profiles.get(family)

    def heat(self, family: Family, now: float) -> int:
        """Routes of family within the heat window ending at now."""
        self._expire(now)
        return self._heat.get(family, 0)

    def node_heat(self, family: Family, node: NodeId, now: float) -> int:
        self._expire(now)
        return self._node_heat.get((family, node), 0)

    def hot(self, now: float, threshold: int) -> list[tuple[Family, int]]:
        """Families with heat >= threshold, hottest first (ties: name)."""
        self._expire(now)
        hot = [(f, n) for f, n in self._heat.items() if n >= threshold]
        return sorted(hot, key=lambda item: (-item[1], item[0]))

    def surging(self, now: float, threshold: int) -> list[tuple[Family, int]]:
        """Families routed at least threshold times within the recent window
        ending at now (recent_window_s), most first (ties: name)."""
        self._expire(now)
        surging = [(f, n) for f, n in self._recent.items() if n >= threshold]
        return sorted(surging, key=lambda item: (-item[1], item[0]))

    def surge_history(self, family: Family, now: float) -> SurgeHistory | None:
        """The family's surges so far; None when it never surged."""
        self._expire(now)
        profile = self._profiles.get(family)
        if profile is None or not profile.surges or profile.first_recent is None:
            return None
        peaks = profile.surge_peaks + profile.peak
        return SurgeHistory(profile.surges, peaks / profile.surges, now - profile.first_recent, profile.peak > 0)

    def hottest_by_node(self, now: float) -> dict[NodeId, tuple[Family, int]]:
        """Per node, the family routed to it most within the window (ties: name)."""
        self._expire(now)
        best: dict[NodeId, tuple[Family, int]] = {}
        for (family, node), n in self._node_heat.items():
            current = best.get(node)
            if current is None or (-n, family) < (-current[1], current[0]):
                best[node] = (family, n)
        return best

    def node_route_rates(self, now: float) -> dict[NodeId, float]:
        """Routes per second to each node over the heat window ending at now."""
        self._expire(now)
        window = self._s.heat_window_s
        return {node: n / window for node, n in self._node_routes.items()}

    def __len__(self) -> int:
        return len(self._profiles)

    def _expire(self, now: float) -> None:
        horizon = now - self._s.heat_window_s
        window = self._window
        while window and window[0][0] <= horizon:
            _, family, node = window.popleft()
            _decrement(self._heat, family)
            _decrement(self._node_heat, (family, node))
            _decrement(self._node_routes, node)
        horizon = now - self._s.recent_window_s
        recent = self._recent_window
        while recent and recent[0][0] <= horizon:
            family = recent.popleft()[1]
            _decrement(self._recent, family)
            if self._recent.get(family, 0) < self._s.surge_min_routes:
                profile = self._profiles.get(family)
                if profile is not None and profile.peak:
                    profile.surge_peaks += profile.peak  # the surge is over
                    profile.peak = 0


def _follow_chain(chain: list[int], hashes: Sequence[int], max_blocks: int, diverged: bool) -> bool:
    """In place: extends chain to hashes (capped) when hashes continues it and
    the family never diverged, else cuts it to their common prefix. Returns
    whether the family has diverged now."""
    n = len(chain)
    if len(hashes) >= n and list(hashes[:n]) == chain:  # the usual case, one C-level comparison
        if not diverged:
            chain.extend(hashes[n:max_blocks])
        return diverged
    common = 0
    for a, b in zip(chain, hashes):
        if a != b:
            break
        common += 1
    del chain[common:]
    return True


def _decrement(counts: dict, key: object) -> None:
    """key is counted (its window entry added it)."""
    left = counts[key] - 1
    if left > 0:
        counts[key] = left
    else:
        del counts[key]
