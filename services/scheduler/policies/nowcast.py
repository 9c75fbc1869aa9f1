"""The nowcast: a burst the cluster is in, as a forecast the planner prices.

A count forecast smoothed over seconds reaches a burst's rate only seconds
after the burst began, and the planner, pricing what it is told, then
values a copy for a family whose holder is already queueing at nothing
(docs/planner.md, "Held-out seeds"). So `predictive` adds, for every family
routed at least `planner.nowcast_min_routes` times within the family
catalog's recent window (`families.recent_window_s`), a BURST forecast of
that rate kept up over the planner's horizon:

    count = routes in the window / recent_window_s x horizon_s

which the planner takes in place of the predictor's own only where it is
larger (a family keeps its largest burst figure: planner.py). It uses
nothing but the routes already seen: a causal forecast, the reactive
signal reactive-heat acts on, priced like any other demand. The oracle
gets none: its forecasts are the future itself. Pure.
"""
from __future__ import annotations

from speckv.services.scheduler.forecasts import Forecast, ForecastKind
from speckv.services.scheduler.policies.base import FamilyReader


def nowcast_forecasts(families: FamilyReader, now: float, horizon_s: float, window_s: float,
                      min_routes: int) -> list[Forecast]:
    """One BURST forecast per family routed at least min_routes times in the
    window_s (s) ending at now, for horizon_s (s); none when min_routes <= 0."""
    if min_routes <= 0:
        return []
    rate_per_s = 1.0 / window_s
    return [Forecast(family, horizon_s, n * rate_per_s * horizon_s, n * rate_per_s * horizon_s, 1.0,
                     ForecastKind.BURST)
            for family, n in families.surging(now, min_routes)]
