"""The nowcast: a burst the cluster is in, as a forecast the planner prices.

A count forecast smoothed over seconds reaches a burst's rate only seconds
after the burst began, and the planner, pricing what it is told, then
values a copy for a family whose holder is already queueing at nothing
(docs/planner.md, "Held-out seeds"). So `predictive` adds, for every family
routed at least `planner.nowcast_min_routes` times within the family
catalog's recent window (`families.recent_window_s`), a BURST forecast of
that rate kept up over the planner's horizon:

    count = routes in the window / recent_window_s x (horizon_s + lead_s)

over a horizon of horizon_s + lead_s, which the planner takes in place of
the predictor's own only where it is larger (a family keeps its largest
burst figure: planner.py). It uses
nothing but the routes already seen: a causal forecast, the reactive
signal reactive-heat acts on, priced like any other demand. The oracle
gets none: its forecasts are the future itself. Pure.

The lead (`planner.nowcast_lead_s`; 0: none): a burst under way is taken
to go on past the planner's horizon for as long as a copy ordered now
needs to land. Without it a copy that lands after horizon_s serves none of
the demand priced and is worth 0 ms however long the holder's queue: on
document-bursts' seed 13 a 32k-token copy landing 2.0-2.25 s out was
priced at 0 while the holder's 16-20 forecast requests queued 13-20 s in
the planner's own walk (docs/journal/planner.md, "Dominance on
document-bursts seed 13, traced").
"""
from __future__ import annotations

from typing import Sequence

from speckv.services.common.ids import Family
from speckv.services.scheduler.forecasts import Forecast, ForecastKind


def nowcast_forecasts(surging: Sequence[tuple[str, int]], horizon_s: float, window_s: float,
                      lead_s: float = 0.0) -> list[Forecast]:
    """One BURST forecast per (family, routes in the window_s (s) ending now)
    of FamilyReader.surging, for horizon_s + lead_s (s), at the window's rate."""
    rate_per_s, horizon = 1.0 / window_s, horizon_s + lead_s
    return [Forecast(Family(family), horizon, n * rate_per_s * horizon, n * rate_per_s * horizon, 1.0,
                     ForecastKind.BURST)
            for family, n in surging]
