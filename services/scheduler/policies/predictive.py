"""Policy `predictive` (ours): act ahead of forecast demand.

Every tick, prepare() asks the ForecastSource (the predictor service in the
live cluster, an in-process predictor in the simulator) for the top
`planner.max_families_per_tick` families by expected arrivals within
`planner.horizon_s` seconds, plus a nowcast of every family whose burst the
cluster is in (nowcast.py: its rate over the last `families.recent_window_s`
kept up over the horizon, where that exceeds the forecast; with
`planner.nowcast_lead_s` > 0 kept up that much longer, so a copy that lands
after the horizon is priced against the burst it would still meet); plan() hands
them to the Planner (planner.py),
which prices every candidate replica and prefetch in milliseconds of TTFT
(saving minus the evictions and link delay it causes) and admits, greedily,
those with a positive net under the per-link and per-node budgets
(`budgets.*`), each with a lease of `leases.replica_lease_ms`. Orders still
unstarted for families no longer forecast are cancelled. It plans at most
every `planner.plan_every_s` (forecasts are not fresher than that; the
scheduler's other ticks leave its orders be), and between those, with
`planner.surge_replan_factor` f > 0, at the first tick where a surging
family's routes in the recent window reached f times what they were at the
last plan (0 if it was not surging): the forecasts fetched then, with the
nowcast of now, so a burst that grows within a second is priced within a
tick, not a second later (docs/planner.md, the agent-cascades trace). If the source is
unavailable (returns nothing), the tick plans on the nowcast alone (the
bursts the scheduler itself sees) and cancels the policy's unstarted orders
for every other family: no forecast, no speculation beyond what is arriving. Thresholds: the
`planner`, `budgets` and `leases` sections of services/config/policies.json.
"""
from __future__ import annotations

from speckv.services.scheduler.forecasts import Forecast, ForecastSource
from speckv.services.scheduler.policies.context import PolicyContext
from speckv.services.scheduler.policies.nowcast import nowcast_forecasts
from speckv.services.scheduler.replication.planner import Planner
from speckv.services.scheduler.views import ClusterView, Plan


class PlanningPolicy:
    """The planner driven by one ForecastSource (predictive and oracle)."""

    name = "planning"
    description = ""
    nowcast = False  # add nowcast.py's forecasts of the bursts the cluster is in

    def __init__(self, context: PolicyContext, source: ForecastSource) -> None:
        self._planner = Planner(context.config, context.profile, context.link, context.host_link, context.disk)
        self._source = source
        self._horizon_s = context.config.planner.horizon_s
        self._max_families = context.config.planner.max_families_per_tick
        self._every_s = context.config.planner.plan_every_s
        self._nowcast_window_s = context.config.families.recent_window_s
        self._nowcast_lead_s = context.config.planner.nowcast_lead_s
        self._nowcast_min_routes = context.config.planner.nowcast_min_routes if self.nowcast else 0
        self._surge_factor = context.config.planner.surge_replan_factor if self.nowcast else 0.0
        self._surging_at_plan: dict[str, int] = {}  # family -> its routes in the recent window at the last plan
        self._planned_at: float | None = None
        self._fresh = False  # prepare() fetched forecasts that plan() has not used yet
        self._forecasts: list[Forecast] = []

    def prepare(self, now: float) -> None:
        if self._planned_at is None or now - self._planned_at >= self._every_s - 1e-9:
            self._forecasts = self._source.forecast(now, self._horizon_s, self._max_families)
            self._fresh = True

    def plan(self, now: float, view: ClusterView) -> Plan:
        """Plans on forecasts its own prepare() just fetched (the two read
        the clock apart: deciding twice could plan on stale ones), or, when
        a surge grew (module docstring), on the last ones with today's
        nowcast; otherwise not at all."""
        watch = self._nowcast_min_routes > 0 and view.families is not None and (self._fresh or self._surge_factor > 0)
        surging = view.families.surging(now, self._nowcast_min_routes) if watch else []
        if not self._fresh and not self._surge_grew(surging):
            return Plan()
        if self._fresh:
            self._planned_at = now  # a surge's extra plan leaves the regular cadence as it was
        self._fresh = False
        self._surging_at_plan = dict(surging)
        forecasts = self._forecasts
        if surging:
            forecasts = forecasts + nowcast_forecasts(surging, self._horizon_s, self._nowcast_window_s,
                                                      self._nowcast_lead_s)
        return self._planner.plan(now, view, forecasts, self.name)

    def _surge_grew(self, surging: list[tuple[str, int]]) -> bool:
        if self._surge_factor <= 0 or self._planned_at is None:
            return False
        return any(n >= self._surge_factor * self._surging_at_plan.get(family, 0) for family, n in surging)


class PredictivePolicy(PlanningPolicy):
    name = "predictive"
    nowcast = True
    description = ("Forecast-driven speculation: the planner prices each replica (to a peer's host or "
                   "device tier) and prefetch (host -> device at a holder) in expected ms of TTFT saved "
                   "minus ms its evictions and link use cost, and issues those with a positive net "
                   "under link and memory budgets, with leases.")
