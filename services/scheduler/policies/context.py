"""What policies are built from: the committed policy configuration, the
engine and link cost models, and (for the forecast-driven ones) where their
foresight comes from. One context per scheduler; policies are created from
it by name (registry.py), so switching policy at run time keeps the inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

from speckv.services.common.engine_profile import EngineProfile, LinkModel
from speckv.services.scheduler.forecasts import ForecastSource, FutureArrivals
from speckv.services.scheduler.policy_config import PolicyConfig


@dataclass(frozen=True, slots=True)
class PolicyContext:
    config: PolicyConfig
    profile: EngineProfile
    link: LinkModel
    host_link: LinkModel | None = None  # every node's host<->device link (None: no host tiers)
    disk: LinkModel | None = None  # every node's disk-tier reads (None: disk blocks priced as host hits)
    forecasts: ForecastSource | None = None  # predictive: the predictor (or an in-process one)
    future: FutureArrivals | None = None  # oracle: the true arrivals, from a trace
