"""Redundancy: what a second copy of a prefix that one live node holds is
worth against that node failing, in the planner's currency (ms of TTFT).

The planner (planner.py) prices one REDUNDANT candidate per family whose
longest held prefix L* has exactly one live holder h (a copy still landing
counts as a holder), per non-holder n among the family's spill nodes: a
copy of L* into n's host tier (its device tier when it has none). Its value:

    p_fail   = 1 - exp(-rate x horizon_h)
    rest     = the family's serve options less h's (serving on h, and
               pulling from h: a dead node serves nothing and sends nothing)
    saving   = p_fail x (TTFT(rest) - TTFT(rest + the copy's option))    ms
    net      = saving - eviction_ms - link_ms                            ms

- rate: `planner.failure_rate_per_node_hour`, unexpected failures per node
  (one engine) per hour, failures being Poisson at that constant rate
  (exponential time to failure), independent of load and of each other;
  horizon_h: the family's demand horizon in hours (Demand.horizon_ms / 3.6e6).
- TTFT(...): value.walk over the family's forecast requests, the same walk
  every other action is priced with (ms, weighted sum).
- eviction_ms and link_ms: the replicate candidate's prices of the same copy
  (planner._Tick.value), unchanged: the bytes and pages cost what they cost
  whatever the copy is for.
- Admission: as every action, net > `planner.min_net_ms`, within the link
  and memory budgets, greedy by net with the others; and saving >=
  `planner.redundancy_min_saving_ms`: a copy onto free pages over idle
  links is priced at 0 ms, so without that floor any positive saving, a
  millionth of a millisecond at the published rate, would buy one.
- Families: only those the planner prices at all, whose expected TTFT now
  exceeds every request hitting L* on an idle node by more than
  `min_net_ms`. A family its sole holder serves about ideally would lose
  more than that gap with the holder, so this under-prices redundancy for
  them; it keeps the planner's work per tick what it was (docs/failover.md
  measured lifting it on the conversation slice: no order changed).

The failure is priced as if it happened now: every forecast request then
finds h gone. A failure at a uniform time within the horizon spares the
requests before it, so this is an upper bound (about twice the expectation
for demand spread evenly over the horizon), and it also ignores that a copy
still in flight from h dies with h: both err in the copy's favour, so a
redundant copy the planner rejects is one that does not pay. The copy's
worth when h stays up (requests it takes off a queued holder) is not
counted here: that is the replicate action's saving, and a node that takes
either copy is a holder for the rest of the tick, so the two never stack.
Pure: no I/O.
"""
from __future__ import annotations

import math
from typing import Sequence

from speckv.services.scheduler.replication.value import Demand, ServeOption, walk

MS_PER_HOUR = 3.6e6


def failure_probability(rate_per_node_hour: float, horizon_ms: float) -> float:
    """P(a node fails within horizon_ms) at a constant rate of failures per hour."""
    if rate_per_node_hour <= 0.0 or horizon_ms <= 0.0:
        return 0.0
    return -math.expm1(-rate_per_node_hour * horizon_ms / MS_PER_HOUR)


def without_node(options: Sequence[ServeOption], node: str) -> list[ServeOption]:
    """The options left when node is gone: none served on it or pulled from it."""
    return [o for o in options if o.node != node and not (o.pull_ms and o.pull_link == node)]


def failover_saving_ms(options: Sequence[ServeOption], copy: ServeOption, holder: str, demand: Demand,
                       p_fail: float) -> float:
    """p_fail x the TTFT (ms, over demand's requests) the copy saves when
    holder is gone. options must hold a ready option besides holder's (a
    recompute on another node): value.walk needs one."""
    if p_fail <= 0.0:
        return 0.0
    rest = without_node(options, holder)
    return p_fail * (walk(rest, demand)[0] - walk(rest + [copy], demand)[0])
