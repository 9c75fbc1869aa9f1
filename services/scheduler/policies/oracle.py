"""Policy `oracle`: the planner fed with the true future (the ceiling that
prediction chases).

Identical to `predictive` (see predictive.py and planner.py: same planner,
same `planner`, `budgets` and `leases` thresholds from
services/config/policies.json) except for the input: instead of forecasts it
reads, each tick, the exact number of requests per family that will arrive
within `planner.horizon_s` seconds (the family-burst forecast's horizon) and
within the replica lease (as RETURN forecasts: the window session-return
forecasts are asked for) and within `retain.ttl_s` (as RETENTION
forecasts: a family that will come back counts as certain), from a FutureArrivals source fed by the trace being replayed
(TraceFutureArrivals; scheduler time t is trace time t - time_offset_s).
Expected count, upper quantile and burst probability are all the truth, so
any gap between oracle and predictive is forecast error.
"""
from __future__ import annotations

from speckv.services.scheduler.forecasts import CombinedForecasts, ForecastKind, FutureArrivals, FutureForecasts
from speckv.services.scheduler.policies.context import PolicyContext
from speckv.services.scheduler.policies.predictive import PlanningPolicy


class OraclePolicy(PlanningPolicy):
    name = "oracle"
    description = ("The planner on the true future arrivals read from the trace: the upper bound "
                   "of forecast-driven replication.")

    def __init__(self, context: PolicyContext, future: FutureArrivals) -> None:
        lease_s = context.config.leases.replica_lease_ms / 1e3
        sources = [FutureForecasts(future), FutureForecasts(future, window_s=lease_s, kind=ForecastKind.RETURN)]
        retain = context.config.retain
        if retain.enabled:
            sources.append(FutureForecasts(future, window_s=retain.ttl_s, kind=ForecastKind.RETENTION,
                                           max_families=retain.max_families, curve=retain.pricing == "curve"))
        PlanningPolicy.__init__(self, context, CombinedForecasts(sources))
