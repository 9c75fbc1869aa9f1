"""The predictor in process: the live PredictorCore behind the scheduler's
two small interfaces (ArrivalSink in, ForecastSource out), on the virtual clock.

Models:
- "builtin": the predictor service's default EWMA (PredictorConfig's
  builtin model), warmed with the arrivals of the `warmup_s` of trace before
  the slice as the live e2e run warms the service: the Simulation routes them
  through the scheduler core, which reports each to this core.
- "online": "builtin" at the start, then LightGBM refitted in virtual time
  from the arrivals the simulation routes (online_counts.py): no trace time
  before the slice is needed.
- "lightgbm": the LightGBM bundle trained with the one training path
  (services/predictor/fitting/training.py, services/config/predictor.json, quick
  hyperparameters) by `train_lightgbm` on trace arrivals strictly before the
  slice, then served by the same core (features kept online). Trained once per
  run, before the simulations start (loadgen/sim/cli.py says on what), and
  handed to each simulation as a TrainedPredictor; never sees the slice. Or
  trained on the whole of a different trace (`train_on_other_trace`), for a
  replay that starts at its trace's first arrival.

Arrivals reach the core at once (the live scheduler batches them every
<= 0.2 s; the difference is below the forecast step of 1 s).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speckv.loadgen.workload.scaled import ScaledTrace
from speckv.services.common.clock import Clock
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import Family
from speckv.services.common.traces import TraceRequest
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.fitting.family_counts import aggregate
from speckv.services.predictor.fitting.training import load_config, train_on_counts
from speckv.services.predictor.serving.core import PredictorCore
from speckv.services.predictor.serving.lgbm_served import LightGbmModel
from speckv.services.predictor.serving.observations import Arrival
from speckv.services.scheduler.arrival_reports import ArrivalRecord
from speckv.services.scheduler.forecasts import Forecast

PREDICTOR_KINDS = ("builtin", "lightgbm", "online")


@dataclass(frozen=True, slots=True)
class TrainedPredictor:
    """A model trained before the simulations and what it was trained on
    (the SimRun's predictor description). Picklable: it reaches worker
    processes inside their Job."""

    model: LightGbmModel
    description: str
    other_trace: bool = False  # trained on a different trace (--train-trace), none of the replayed one


def train_lightgbm(history: Sequence[TraceRequest], source: str = "the trace") -> TrainedPredictor:
    """LightGBM trained on history: trace requests before the slice, on the
    simulation's clock. source names where they come from, for the description."""
    if not history:
        raise InvalidArgument("--predictor=lightgbm needs trace time before the slice to train on")
    training = load_config(quick=True)
    times = np.array([r.arrival_s for r in history])
    counts = aggregate(times, [r.family for r in history], training.step_s, start_s=float(np.floor(times.min())))
    trained = train_on_counts(counts, training)
    model = LightGbmModel(trained.bundle, "sim-pre-slice", trace=f"{source} before the slice")
    return TrainedPredictor(model, f"LightGBM trained on {len(history)} arrivals in [{times.min():.0f}, "
                                   f"{times.max():.0f}] s of {source} ({trained.bundle.train_s:.1f} s to train)")


def train_on_base(workload: ScaledTrace, start_s: float, warmup_s: float) -> TrainedPredictor:
    """LightGBM trained on copy 0 of workload alone: its requests in
    [start_s - warmup_s, start_s), as a one-copy replay of the trace (the
    configuration's own node count) has them; copy 0 keeps the same arrival
    times in a workload of any number of copies."""
    base = ScaledTrace(workload.base, 1)
    lo, hi = base.window(start_s - warmup_s, start_s)
    return train_lightgbm([base[i] for i in range(lo, hi)], source="the base trace")


def train_on_other_trace(requests: Sequence[TraceRequest], name: str) -> TrainedPredictor:
    """LightGBM trained on every request of a different trace: a model that
    has seen none of the replayed one, so a replay may start at its first
    arrival (no trace time before it to train on) and still serve LightGBM."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    trained = train_lightgbm(ordered, source=f"{name} (a different trace, whole)")
    return TrainedPredictor(trained.model, trained.description, other_trace=True)


def lightgbm_note(trained: TrainedPredictor, base_nodes: int, warmup_s: float, copies: int) -> str:
    """The run note saying what the model saw."""
    if trained.other_trace:
        return (f"Predictor: {trained.description}; it has seen none of the replayed trace. Trained once, "
                "before the simulations, and served by each.")
    note = (f"Predictor: {trained.description}, the {warmup_s:g} s before the slice as the {base_nodes}-node "
            "configuration sees them; trained once, before the simulations, and served by each.")
    if copies > 1:
        note += (f" Copies k > 0 are rotations of the base trace by k/{copies} of its span, so their evaluated "
                 "windows can overlap the training window in base-trace time: at more than "
                 f"{base_nodes} nodes the LightGBM predictor has partly seen the copies' traffic.")
    return note


def build_predictor(kind: str, clock: Clock, trained: TrainedPredictor | None = None) -> tuple[PredictorCore, str]:
    """(core, description). trained: the model the lightgbm kind serves."""
    config = PredictorConfig()
    if kind == "builtin":
        return PredictorCore(clock, config.builtin_model(), config.core_settings()), "builtin EWMA"
    if kind == "online":  # online_counts.py refits it in virtual time
        return (PredictorCore(clock, config.builtin_model(), config.core_settings()),
                "builtin EWMA until the first validated online refit")
    if kind != "lightgbm":
        raise InvalidArgument(f"--predictor={kind!r}: expected one of {', '.join(PREDICTOR_KINDS)}")
    if trained is None:
        raise InvalidArgument("--predictor=lightgbm needs a model trained before the slice (train_lightgbm)")
    core = PredictorCore(clock, trained.model, config.core_settings(), source="trained in the simulator")
    return core, trained.description


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
