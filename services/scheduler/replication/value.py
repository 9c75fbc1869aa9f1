"""What a speculative action is worth, in one currency: milliseconds of TTFT.

net_ms = saving_ms - eviction_ms - link_ms, and an action is admitted only
when net_ms > 0 (planner.py). Each term:

- saving_ms: expected TTFT of the forecast requests without the action minus
  with it. The requests of one family are served by ServeOptions (a node
  with the prefix it holds: wait before its prefill can start, work on the
  critical path before it such as a promotion or a pull, and the prefill
  itself). `served_ttft_ms` walks the forecast requests in arrival order,
  each taking the option that gives it the least TTFT (as the router does),
  and books that option's node busy for its prefill, so a burst that would
  queue on one holder is priced as queueing, and a copy elsewhere as the
  queueing it avoids. No target caps it: a request that would wait 9 s
  behind the holder saves 9 s on a replica.
- eviction_ms: each block the action pushes out of a tier x P(that block
  is reused before it would have left anyway) x what its reuse then costs
  (a promotion when it only drops to the host tier below, a recompute when
  it leaves the node).
- link_ms: the delay the action's transfer adds to other transfers on the
  same links: pulls arriving at rate r per second on an end during the
  T ms transfer wait T/2 ms on average (FIFO), so r * T/1000 * T/2 per end.
  A stage's is the same on its node's disk: its read of T ms delays the
  disk loads routed there at rate r (disk_backlog.py) by r * T/1000 * T/2.

Demand: `count` requests expected within `horizon_ms` of now, the forecasts
saying how many but not exactly when: n points placed evenly (the k-th at
(k + 1/2) * horizon/n), each weighing count / n requests, with n = ceil(count)
clamped to [MIN_PRICED_POINTS, MAX_PRICED_REQUESTS]. So a single likely
return is priced over the whole window it may come in (a holder busy for
the first seconds of it costs the share of arrivals that find it busy), not
at one instant. All times in ms from now. Pure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

MAX_PRICED_REQUESTS = 256
MIN_PRICED_POINTS = 4


@dataclass(frozen=True, slots=True)
class ServeOption:
    """One way to serve a family's next request on one node (ms)."""

    node: str
    queue_ms: float  # until the node's compute is free for new work
    before_ms: float  # on the request's critical path before prefill (promotion, pull)
    prefill_ms: float  # prefill with the prefix this option gives
    ready_ms: float = 0.0  # from now until the option exists (a replica landing)
    pull_ms: float = 0.0  # a pull on the critical path, occupying pull_link for this long
    pull_link: str = ""  # the link the pull occupies (its source's), shared by every pull from it
    joins: bool = False  # a request arriving before ready_ms waits for it (a stage's read in flight) rather than not use it


@dataclass(frozen=True, slots=True)
class Demand:
    count: float  # expected requests within the horizon (may be < 1: a probability)
    horizon_ms: float

    def arrivals(self) -> list[tuple[float, float]]:
        """(arrival ms from now, weight) of the requests walked."""
        if self.count <= 0:
            return []
        n = min(max(math.ceil(self.count - 1e-12), MIN_PRICED_POINTS), MAX_PRICED_REQUESTS)
        step, weight = self.horizon_ms / n, self.count / n
        return [((k + 0.5) * step, weight) for k in range(n)]


@dataclass(frozen=True, slots=True)
class ActionValue:
    saving_ms: float
    eviction_ms: float
    link_ms: float
    queue_ms: float = 0.0  # what the work it moves between nodes costs the others routed there
    bytes_ms: float = 0.0  # the price of the bytes a copy sends over the network (planner.copy_ms_per_gib)
    insurance_ms: float = 0.0  # what a replica saves its family's next surge, times its chance (insurance.py)

    @property
    def net_ms(self) -> float:
        return self.saving_ms + self.insurance_ms - self.eviction_ms - self.link_ms - self.queue_ms - self.bytes_ms

    @property
    def admitted(self) -> bool:
        return self.net_ms > 0.0


def served_ttft_ms(options: Sequence[ServeOption], demand: Demand) -> float:
    """Weighted sum of the TTFT of demand's requests over options (ms)."""
    return walk(options, demand)[0]


def walk(options: Sequence[ServeOption], demand: Demand) -> tuple[float, dict[str, float]]:
    """(weighted sum of the TTFT of demand's requests over options, ms;
    node -> prefill ms of the requests it took, weighted).


    Each request, at its arrival a, takes the option minimising its TTFT,
    start - a + prefill, among options ready by a, where
      without a pull: start = max(a + before, busy_until(node))
      with a pull:    pulled = max(a + before, link_free(pull_link)) + pull_ms
                      start  = max(pulled, busy_until(node))
    (a pull's before is the link backlog it waits out first, as the router
    adds it). An option not ready by a is skipped, unless it `joins`: then
    the request waits for it, a = its ready_ms in the formulas (a request
    finding its blocks being staged waits for that read).
    busy_until starts at queue_ms and moves to start + weight x prefill (a
    fractional request books its expected share); link_free starts at now and
    moves to the pull's start + weight x pull_ms: pulls from one source take
    turns on its link, so a burst cannot all pull at once for free. Options
    on one node share its busy time. At least one option must be ready at
    once or joinable (recomputing somewhere always is): ValueError otherwise.
    """
    if not any(o.ready_ms <= 0.0 or o.joins for o in options):
        raise ValueError("no option is ready now: include the recompute option")
    busy: dict[str, float] = {o.node: o.queue_ms for o in options}
    work: dict[str, float] = {}
    link_free: dict[str, float] = {o.pull_link: 0.0 for o in options if o.pull_ms}
    total = 0.0
    for arrival, weight in demand.arrivals():
        best_ttft, best_start, best_pull, best = math.inf, 0.0, 0.0, options[0]
        for o in options:
            at = arrival
            if o.ready_ms > arrival:
                if not o.joins:
                    continue
                at = o.ready_ms
            if o.pull_ms:
                pull_start = max(at + o.before_ms, link_free[o.pull_link])
                start = max(pull_start + o.pull_ms, busy[o.node])
            else:
                pull_start = at
                start = max(at + o.before_ms, busy[o.node])
            ttft = start - arrival + o.prefill_ms
            if ttft < best_ttft:
                best_ttft, best_start, best_pull, best = ttft, start, pull_start, o
        total += weight * best_ttft
        busy[best.node] = best_start + weight * best.prefill_ms
        work[best.node] = work.get(best.node, 0.0) + weight * best.prefill_ms
        if best.pull_ms:
            link_free[best.pull_link] = best_pull + weight * best.pull_ms
    return total, work


def saving_ms(without: Sequence[ServeOption], added: Sequence[ServeOption], demand: Demand) -> float:
    """TTFT the demand saves when options `added` join (the planner keeps the
    first term, its family's baseline, between candidates)."""
    return served_ttft_ms(without, demand) - served_ttft_ms(list(without) + list(added), demand)


def eviction_ms(blocks_evicted: int, p_reuse: float, miss_ms_per_block: float) -> float:
    """Expected TTFT lost to the blocks an action pushes out (ms)."""
    return max(0, blocks_evicted) * min(max(p_reuse, 0.0), 1.0) * max(miss_ms_per_block, 0.0)


def queue_externality_ms(work_before: Mapping[str, float], work_after: Mapping[str, float],
                         routes_per_s: Mapping[str, float]) -> float:
    """Expected delay an action adds to the other requests routed to the
    nodes whose work it changes: requests arriving at rate r during an added
    busy time of W ms wait W/2 on average, r x W/1000 x W/2; work taken off a
    node gives the same back (signed). ms. Summed in node order, so the
    figure does not depend on the process's string hashing (a set's order)."""
    total = 0.0
    for node in sorted(set(work_before) | set(work_after)):
        delta = work_after.get(node, 0.0) - work_before.get(node, 0.0)
        total += max(routes_per_s.get(node, 0.0), 0.0) * delta * abs(delta) / 2e3
    return total


def link_delay_ms(transfer_ms: float, pulls_per_s: Sequence[float]) -> float:
    """Expected delay a transfer of transfer_ms adds to pulls arriving on its
    ends at the given rates (per second, one per end) (ms)."""
    return sum(max(r, 0.0) for r in pulls_per_s) * transfer_ms / 1e3 * transfer_ms / 2.0
