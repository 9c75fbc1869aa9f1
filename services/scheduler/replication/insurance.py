"""Insurance: what a replica is worth against its family's next surge, in
the planner's currency (ms of TTFT), beside what it saves the forecast
requests of its lease.

A replica outlives the forecast it was priced on: it stays on its target
until evicted, a second holder that routing spreads the family over and
that the family's next surge finds in place, while a replica ordered when
the surge begins lands seconds into it (docs/planner.md, "Replicas unread in
their lease"). The planner (planner.py) prices that for a family that has
surged before (families.py: its recent routes reached
`families.surge_min_routes`) and is not surging now:

    rate     = surges / max(observed_s, life_s)          surges per second
    p_surge  = 1 - exp(-rate x life_s)
    surge    = Demand(mean_peak / recent_window_s x horizon_s, horizon_s)
    saving   = p_surge x (TTFT(options, surge) - TTFT(options + copy, surge))

- life_s: `planner.insurance_life_s`, the time the copy is insured for; a
  replica whose insurance is worth more than its forecast saving carries
  it as its lease (the kvstore keeps it against eviction that long, and its
  outcome is judged over it).
- rate: the family's surges since its first live route, as if Poisson; a
  family observed for less than life_s is counted over life_s, so one surge
  seen early is not a certainty.
- surge: a surge at its mean peak rate over the planner's horizon, walked
  as every forecast is (value.walk) from the options the family has now:
  the holder's queue now stands for the queue the surge will find.
- Only families the planner prices at all (forecast this tick) get it.

Pure: numbers in, numbers out.
"""
from __future__ import annotations

import math
from typing import Sequence

from speckv.services.scheduler.families import SurgeHistory
from speckv.services.scheduler.replication.value import Demand, ServeOption, walk


def surge_probability(history: SurgeHistory, life_s: float) -> float:
    """P(the family surges again within life_s), from its surges so far."""
    if life_s <= 0 or history.surges <= 0:
        return 0.0
    rate = history.surges / max(history.observed_s, life_s)
    return 1.0 - math.exp(-rate * life_s)


def surge_demand(history: SurgeHistory, recent_window_s: float, horizon_s: float) -> Demand:
    """A surge at the family's mean peak rate over the planner's horizon."""
    return Demand(history.mean_peak / recent_window_s * horizon_s, horizon_s * 1e3)


def insurance_ms(options: Sequence[ServeOption], option: ServeOption, surge: Demand, p_surge: float) -> float:
    """p_surge x the TTFT the copy's option saves the surge's requests (ms, >= 0)."""
    if p_surge <= 0:
        return 0.0
    without, _ = walk(options, surge)
    with_copy, _ = walk([*options, option], surge)
    return p_surge * max(0.0, without - with_copy)
