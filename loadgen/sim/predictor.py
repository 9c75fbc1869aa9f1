"""The predictor in process: the live PredictorCore behind the scheduler's
two small interfaces (ArrivalSink in, ForecastSource out), on the virtual clock.

Models:
- "builtin": the predictor service's default EWMA (PredictorConfig's
  builtin model), warmed with the arrivals of the `warmup_s` of trace before
  the slice as the live e2e run warms the service: the Simulation routes them
  through the scheduler core, which reports each to this core.
- "lightgbm": the LightGBM bundle trained with the one training path
  (services/predictor/training.py, services/config/predictor.json, quick
  hyperparameters) on the trace's arrivals strictly before the slice, then
  served by the same core (features kept online). Never sees the slice.

Arrivals reach the core at once (the live scheduler batches them every
<= 0.2 s; the difference is below the forecast step of 1 s).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from speckv.loadgen.traces import TraceRequest
from speckv.services.common.clock import Clock
from speckv.services.common.errors import InvalidArgument
from speckv.services.predictor.arrivals import Arrival
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.core import PredictorCore
from speckv.services.predictor.lgbm_model import LightGbmModel
from speckv.services.predictor.timeseries import aggregate
from speckv.services.predictor.training import load_config, train_on_counts
from speckv.services.scheduler.arrivals import ArrivalRecord
from speckv.services.scheduler.forecasts import Forecast
from speckv.services.scheduler.ids import Family

PREDICTOR_KINDS = ("builtin", "lightgbm")


def build_predictor(kind: str, clock: Clock, history: Sequence[TraceRequest]) -> tuple[PredictorCore, str]:
    """(core, description). history: trace requests before the slice, on the
    simulation's clock (the lightgbm kind trains on all of them)."""
    config = PredictorConfig()
    if kind == "builtin":
        return PredictorCore(clock, config.builtin_model(), config.core_settings()), "builtin EWMA"
    if kind != "lightgbm":
        raise InvalidArgument(f"--predictor={kind!r}: expected one of {', '.join(PREDICTOR_KINDS)}")
    if not history:
        raise InvalidArgument("--predictor=lightgbm needs trace time before the slice to train on")
    training = load_config(quick=True)
    times = np.array([r.arrival_s for r in history])
    counts = aggregate(times, [r.family for r in history], training.step_s, start_s=float(np.floor(times.min())))
    trained = train_on_counts(counts, training)
    model = LightGbmModel(trained.bundle, "sim-pre-slice", trace="trace before the slice")
    core = PredictorCore(clock, model, config.core_settings(), source="trained in the simulator")
    return core, (f"LightGBM trained on {len(history)} arrivals in [{times.min():.0f}, {times.max():.0f}] s "
                  f"({trained.bundle.train_s:.1f} s to train)")



class CoreArrivals:
    """ArrivalSink: routed requests go straight into the core."""

    def __init__(self, core: PredictorCore) -> None:
        self._core = core

    def offer(self, arrival: ArrivalRecord) -> bool:
        self._core.observe([Arrival(arrival.time_s, arrival.family, arrival.node_id, arrival.prompt_tokens,
                                    arrival.cached_tokens)])
        return True


class CoreForecasts:
    """ForecastSource: the core's top families at one horizon."""

    def __init__(self, core: PredictorCore) -> None:
        self._core = core

    def forecast(self, now: float, horizon_s: float, max_families: int) -> list[Forecast]:
        result = self._core.top_families(max(1, max_families), [horizon_s], now)
        # Whole columns to floats at once: a predictive tick asks for 256 families every 0.25 s.
        columns = (result.expected[:, 0].tolist(), result.upper[:, 0].tolist(),
                   result.burst_probability[:, 0].tolist())
        return [Forecast(Family(f), horizon_s, e, u, b) for f, e, u, b in zip(result.families, *columns)]
