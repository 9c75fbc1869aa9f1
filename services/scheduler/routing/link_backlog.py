"""How long each node's link is already spoken for by transfers the
scheduler itself started: the pulls it routed and the replication orders it
issued.

Why: a route that pulls a prefix pays the transfer on its critical path,
and transfers that share a link share its bandwidth. Costing a pull at the
idle link's speed sends every request of a burst after the same holder's
bytes at once: each expects 1.4 s for a 32k-token prefix over 25 Gbit/s and
all of them get it only after the others, tens of seconds later. With the
backlog, once the holder's link is busy enough, recomputing (or queueing on
the holder) wins the route, as it should.

Model: each node's link is a FIFO. A transfer of B bytes between source
and target starts when both ends are free (or now) and occupies both for
LinkModel.transfer_ms(B); its completion becomes both ends' `busy_until`.
Under the processor sharing of a real link (and of the simulator's network)
a newcomer finishes no later than FIFO says, so the estimate is an upper
bound that relaxes as time passes. Times are seconds on the scheduler's
clock. Transfers the scheduler did not start (other clusters, on-demand
copies by hand) are not seen. Not thread-safe: SchedulerCore serialises
access.

Pull rates: each end of a route that could pull (some node holds a longer
prefix than the node routed to, whether the router pulled or recomputed)
counts one on its link, in an exponentially decayed count (half-life
rate_halflife_s); rate_per_s is that count over the half-life's mean life
(halflife / ln 2), so a steady r a second reads r. Counting the pulls that
could happen, not those that did, keeps the figure from falling exactly when
a busy link makes the router recompute instead. The planner prices the
delay a speculative copy adds to pulls with it.
"""
from __future__ import annotations

import math

from speckv.services.common.engine_profile import LinkModel
from speckv.services.common.ids import NodeId


class LinkBacklog:
    def __init__(self, link: LinkModel, rate_halflife_s: float = 30.0) -> None:
        self._link = link
        self._busy_until: dict[NodeId, float] = {}
        self._halflife_s = rate_halflife_s
        self._pulls: dict[NodeId, tuple[float, float]] = {}  # node -> (decayed count, at s)

    def wait_ms(self, node: NodeId, now: float) -> float:
        """How long until node's link finishes what it was given (ms, >= 0)."""
        busy = self._busy_until.get(node)
        return 0.0 if busy is None or busy <= now else (busy - now) * 1e3

    def add(self, source: NodeId, target: NodeId, nbytes: int, now: float) -> float:
        """Books a transfer of nbytes source -> target; returns when it is
        expected to complete (s)."""
        start = max(now, self._busy_until.get(source, now), self._busy_until.get(target, now))
        end = start + self._link.transfer_ms(nbytes) / 1e3
        self._busy_until[source] = end
        self._busy_until[target] = end
        return end

    def note_pull(self, source: NodeId, target: NodeId, now: float) -> None:
        for node in (source, target):
            self._pulls[node] = (self._decayed(node, now) + 1.0, now)

    def rate_per_s(self, node: NodeId, now: float) -> float:
        """Recent pulls per second on node's link."""
        return self._decayed(node, now) * math.log(2) / self._halflife_s

    def rates(self, now: float) -> dict[NodeId, float]:
        return {n: self.rate_per_s(n, now) for n in self._pulls}

    def waits(self, now: float) -> dict[NodeId, float]:
        return {n: self.wait_ms(n, now) for n in self._busy_until if self._busy_until[n] > now}

    def _decayed(self, node: NodeId, now: float) -> float:
        count, at = self._pulls.get(node, (0.0, now))
        return count * math.exp2(-max(0.0, now - at) / self._halflife_s)

    def forget(self, node: NodeId) -> None:
        """A node that re-registered or left: its old transfers are gone."""
        self._busy_until.pop(node, None)
        self._pulls.pop(node, None)

    def prune(self, now: float) -> None:
        """Drops links that are idle by now (bounds the map by busy links)."""
        self._busy_until = {n: t for n, t in self._busy_until.items() if t > now}
        self._pulls = {n: (c, at) for n, (c, at) in self._pulls.items()
                       if c * math.exp2(-max(0.0, now - at) / self._halflife_s) > 1e-3}
