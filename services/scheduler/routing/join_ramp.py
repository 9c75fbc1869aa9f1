"""The join ramp: a node that joins a serving cluster takes its share of
misses gradually, while what it already holds is routed to it at once.

Rule (router.join_ramp_s = R seconds; 0 turns it off). A node *joins* when
it registers while the cluster has already routed requests (a cluster
starting up has none, so its nodes never ramp). From its registration at
t0 until t0 + R, with

  phi(t)   = (t - t0) / R                    its ramp, 0 -> 1
  routed   = routes the cluster made since t0
  fair     = routed / live_at_join           its full share of them
  allowed  = phi(t) x fair + 1               (+1: its first route is never held back)
  taken    = routes it received since t0

it is *over* its allowance while taken >= allowed. A node over its
allowance is left out of a route's candidates unless it holds strictly
more of the request's prefix than every other candidate (a pre-warmed
replica, a session it served): what it holds still goes to it, the misses
it would draw come to it only as fast as the ramp lets them. live_at_join is
the live node count just after it joined (the count the share divides by;
nodes joining or leaving during the ramp do not move it). After t0 + R, or
when the node leaves, it ramps no more.

Why: an idle joining node is the cheapest place for every miss, so without
a ramp it draws a burst of them at once (docs/failover.md measures what that
costs and what the ramp buys). Pure; time only from the callers' `now`.
"""
from __future__ import annotations

from dataclasses import dataclass

from speckv.services.common.ids import NodeId


@dataclass(slots=True)
class _Joining:
    start_s: float
    cluster_routes_at_join: int
    node_routes_at_join: int
    live_at_join: int


class JoinRamp:
    """The nodes ramping now, and whether each is over its allowance."""

    def __init__(self, ramp_s: float) -> None:
        if ramp_s < 0:
            raise ValueError(f"ramp_s={ramp_s}: must be >= 0")
        self._ramp_s = ramp_s
        self._joining: dict[NodeId, _Joining] = {}

    def active(self, now: float) -> bool:
        """Some node is ramping at now (the router's fast path skips the
        ramp otherwise); ramps that have run their course end here."""
        if not self._joining:
            return False
        for node_id in [n for n, j in self._joining.items() if now - j.start_s >= self._ramp_s]:
            del self._joining[node_id]
        return bool(self._joining)

    def joined(self, node_id: NodeId, now: float, cluster_routes: int, node_routes: int, live_after: int) -> bool:
        """A node registered at now; it ramps when the ramp is on and the
        cluster had routed requests before it came. Returns whether it ramps."""
        self._joining.pop(node_id, None)
        if self._ramp_s <= 0 or cluster_routes <= 0:
            return False
        self._joining[node_id] = _Joining(now, cluster_routes, node_routes, max(1, live_after))
        return True

    def forget(self, node_id: NodeId) -> None:
        """The node left (lost, removed): it ramps no more."""
        self._joining.pop(node_id, None)

    def share(self, node_id: NodeId, now: float) -> float:
        """Its ramp phi in [0, 1]; 1 for a node not ramping."""
        joining = self._joining.get(node_id)
        if joining is None:
            return 1.0
        return min(1.0, max(0.0, (now - joining.start_s) / self._ramp_s))

    def over(self, node_id: NodeId, now: float, cluster_routes: int, node_routes: int) -> bool:
        """Whether node_id is over its allowance at now (module docstring);
        ends its ramp (False from then on) once t0 + R has passed."""
        joining = self._joining.get(node_id)
        if joining is None:
            return False
        phi = (now - joining.start_s) / self._ramp_s
        if phi >= 1.0:
            del self._joining[node_id]
            return False
        fair = (cluster_routes - joining.cluster_routes_at_join) / joining.live_at_join
        taken = node_routes - joining.node_routes_at_join
        return taken >= max(0.0, phi) * fair + 1.0

    def ramping(self, now: float) -> list[NodeId]:
        """The nodes ramping at now, sorted."""
        return sorted(self._joining) if self.active(now) else []
