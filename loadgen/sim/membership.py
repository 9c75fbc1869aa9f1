"""Node loss and node addition in a simulation (services/config/events.json):
what the simulation remembers about them.

Rules the simulation follows (simulation.py, "node events"):
- A kill is the node's kvstore and engine dying at once: the scheduler hears
  of it at once (its event stream closes: SchedulerCore.node_lost), its KV
  is gone, its engine never advances again, and the reference router
  re-sends every request that was on it or pulling from it: before the first
  token from the start, during decode with the tokens already streamed
  appended to its prompt (Dynamo's request migration), at most
  `migration_limit` times a request; one more loss fails it (lost).
- An add is a cold node (empty pools, a fresh engine) registering with the
  running scheduler, alive from that instant.
- recompute_tokens of a kill: block tokens of the lost node's blocks that a
  node later prefilled again (each block counted once, through the run's
  end): the work a second copy would have saved.
Holds no simulation objects; mypyc-compiled with the simulation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from speckv.loadgen.experiments.event_metrics import WINDOW_S, EventOutcome
from speckv.loadgen.experiments.migration import DEFAULT_MIGRATION_LIMIT
from speckv.services.common.ids import NodeId


@dataclass(slots=True)
class Membership:
    migration_limit: int = DEFAULT_MIGRATION_LIMIT
    dead: set[NodeId] = field(default_factory=set)
    lifetimes: dict[str, tuple[float, float]] = field(default_factory=dict)  # node -> (joined, left), trace s
    outcomes: list[EventOutcome] = field(default_factory=list)
    # Set only in runs with events (the bookkeeping costs every store otherwise):
    tracking: bool = False
    roots: dict[NodeId, dict[int, str]] = field(default_factory=dict)  # node -> chain root hash -> family
    lost_blocks: dict[int, EventOutcome] = field(default_factory=dict)  # block hash -> the kill that lost it
    kills: list[tuple[EventOutcome, set[int]]] = field(default_factory=list)  # each kill with the blocks it lost

    def stored(self, node: NodeId, root: int, family: str) -> None:
        if self.tracking:
            self.roots.setdefault(node, {})[root] = family

    def prefilled(self, hashes: list[int], block_tokens: int) -> None:
        """New blocks a node computed: those a kill lost count as recomputed."""
        lost = self.lost_blocks
        if not lost:
            return
        for h in hashes:
            outcome = lost.pop(h, None)
            if outcome is not None:
                outcome.recompute_tokens += block_tokens

    def killed(self, node: NodeId, at_s: float, held: set[int], alive_after: int) -> EventOutcome:
        """Records a kill: held is the KV it destroyed (the node's blocks no
        survivor holds); the families whose chain roots are among them, and
        those blocks as lost until something recomputes them."""
        self.dead.add(node)
        joined, _ = self.lifetimes.get(node, (-math.inf, math.inf))
        self.lifetimes[node] = (joined, at_s)
        roots = self.roots.pop(node, {})
        outcome = EventOutcome("kill", at_s, str(node), frozenset(f for r, f in roots.items() if r in held),
                               alive_nodes_after=alive_after)
        for h in held:
            self.lost_blocks.setdefault(h, outcome)
        self.outcomes.append(outcome)
        self.kills.append((outcome, held))
        return outcome

    def ordered(self, target: str, now: float) -> None:
        """An order targeting target was issued at now: a pre-warm order of an
        add whose node it is, within WINDOW_S of its joining."""
        for outcome in self.outcomes:
            if (outcome.kind == "add" and outcome.node == target and outcome.prewarm_orders is not None
                    and outcome.at_s <= now < outcome.at_s + WINDOW_S):
                outcome.prewarm_orders += 1

    def arrived(self, request_id: str, hashes: tuple[int, ...]) -> None:
        """Marks a request affected by every kill whose lost blocks its prompt holds."""
        for outcome, held in self.kills:
            if not held.isdisjoint(hashes):
                outcome.affected_requests.add(request_id)

    def added(self, node: NodeId, at_s: float, alive_after: int) -> EventOutcome:
        self.lifetimes[node] = (at_s, math.inf)
        outcome = EventOutcome("add", at_s, str(node), alive_nodes_after=alive_after, prewarm_orders=0)
        self.outcomes.append(outcome)
        return outcome
