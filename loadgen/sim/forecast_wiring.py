"""What a simulated planner reads: the forecast sources one Simulation wires
for its policy (simulation.py builds them once, before the warm start).

- A policy that reads no forecasts (not in FORECAST_POLICIES) gets nothing:
  no predictor runs (simulation.py's docstring says why that changes no
  figure).
- A forecast-reading policy gets the predictor core (builtin EWMA, the
  LightGBM trained before the slice, or the EWMA refitted online into
  LightGBM: predictor.py, online_counts.py) as the family-burst source and as
  the arrivals sink.
- With a session-return model (`returns`) or online learning, also the
  session returns (online_returns.py): a RETURN source over the replica
  lease and, with `retain.enabled`, a RETENTION source over `retain.ttl_s`,
  combined with the burst source; the return tracker is warmed on the
  history before the slice's start.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from speckv.loadgen.sim.online_counts import SimCountRefits
from speckv.loadgen.sim.online_returns import SimReturns
from speckv.loadgen.sim.predictor import CoreArrivals, CoreForecasts, TrainedPredictor, build_predictor
from speckv.loadgen.sim.returns import ReturnForecasts, TrainedReturns, warm
from speckv.loadgen.sim.settings import SimSettings
from speckv.services.common.clock import Clock
from speckv.services.common.traces import TraceRequest
from speckv.services.predictor.fitting.returns.config import load_return_config
from speckv.services.scheduler.forecasts import CombinedForecasts, ForecastKind, ForecastSource
from speckv.services.scheduler.policies.registry import FORECAST_POLICIES
from speckv.services.scheduler.policy_config import PolicyConfig


@dataclass(slots=True)
class ForecastWiring:
    """The sources of one simulation; every field None when the policy reads no forecasts."""

    forecasts: CoreForecasts | None  # the predictor's family-burst forecasts (polled for the report's time line)
    arrivals: CoreArrivals | None  # what the scheduler feeds each routed request to
    source: ForecastSource | None  # what the planner reads (bursts, plus returns and retention)
    returns: SimReturns | None  # the session-return tracker (and online fitter) the Simulation feeds
    note: str  # the predictor line of the report
    refits: SimCountRefits | None = None  # the count and burst models' online refits (--predictor online)


def wire(policy: str, settings: SimSettings, policies: PolicyConfig, clock: Clock,
         trained: TrainedPredictor | None, returns: TrainedReturns | None,
         history: Sequence[TraceRequest], start: float) -> ForecastWiring:
    """The forecast sources policy reads (module docstring); start: the slice's first arrival, trace s."""
    if policy not in FORECAST_POLICIES:
        return ForecastWiring(None, None, None, None, f"not run ({policy} reads no forecasts)")
    predictor, note = build_predictor(settings.predictor, clock, trained)
    forecasts, arrivals = CoreForecasts(predictor), CoreArrivals(predictor)
    refits = SimCountRefits.build(predictor) if settings.predictor == "online" else None
    if returns is None and not settings.online_returns:
        return ForecastWiring(forecasts, arrivals, forecasts, None, note, refits)
    config_r = returns.config if returns is not None else load_return_config()
    sim_returns = SimReturns.build(config_r, clock, returns, settings.online_returns)
    warm(sim_returns, history, start, config_r)
    slot = sim_returns.slot
    sources: list[ForecastSource] = [forecasts, ReturnForecasts(slot, policies.leases.replica_lease_ms / 1e3)]
    if policies.retain.enabled:
        sources.append(ReturnForecasts(slot, policies.retain.ttl_s, kind=ForecastKind.RETENTION,
                                       max_families=policies.retain.max_families,
                                       curve=policies.retain.pricing == "curve"))
    note += (f"; plus {returns.description}" if returns is not None else
             "; plus session returns learned online from the slice (cold start)")
    return ForecastWiring(forecasts, arrivals, CombinedForecasts(sources), sim_returns, note, refits)
