"""Training a return model on the history before a cut, for a service that
will serve it from that cut on.

train_before(requests, until_s, config, speed): the turns of the requests
arriving before until_s (turns.py; the configured service model for their
ends), their rows from the one online builder, one LightGBM classifier per
horizon with labels censored at until_s (model.py); never a row after the
cut. Fewer than MIN_TRAINING_TURNS turns train nothing (None).

speed: a replay that compresses trace time speed x onto the services' clock
trains on that clock: arrivals and service times divided by speed, the cut
too, and so are the feature spec's horizons and windows and the tail's step
(what the spec saved with the model, and so the served tracker, then uses).
The model is then the trace-time model read on the compressed clock: the
same rows, labels and censoring (a 15 s horizon at speed 2 is the 30 s
horizon of the trace), every time-valued feature divided by speed and every
rate multiplied by it (LightGBM splits on their order, which scaling keeps).
Unscaled horizons would ask the pre-slice history for speed x as much trace
time per horizon: the longest would find no row whose window closed. The
simulator trains in trace seconds (speed 1). The configured recalibration's
window is scaled the same way (save it with the model).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from speckv.services.common.traces.records import TraceRequest
from speckv.services.predictor.fitting.returns.config import ReturnConfig
from speckv.services.predictor.fitting.returns.dataset import build_rows
from speckv.services.predictor.fitting.returns.model_training import train_return_model
from speckv.services.predictor.fitting.returns.turns import build_turns
from speckv.services.predictor.serving.returns.features import ReturnFeatureSpec
from speckv.services.predictor.serving.returns.model import ReturnModel
from speckv.services.predictor.serving.returns.recalibration import RecalibrationSpec

MIN_TRAINING_TURNS = 500


@dataclass(frozen=True, slots=True)
class TrainedBefore:
    model: ReturnModel
    spec: ReturnFeatureSpec  # the features it reads, on the clock trained on (save it with the model)
    turns: int  # turns trained on (rows are those whose window closed by the cut)
    until_s: float  # the cut, on the clock trained on (trace seconds / speed)
    recalibration: RecalibrationSpec  # the configured one, on the clock trained on (save it with the model)


def train_before(requests: Sequence[TraceRequest], until_s: float, config: ReturnConfig,
                 speed: float = 1.0) -> TrainedBefore | None:
    """The return model on the requests before until_s (trace seconds),
    on the clock trace / speed; None with fewer than MIN_TRAINING_TURNS turns."""
    if not (math.isfinite(speed) and speed > 0):
        raise ValueError(f"speed={speed!r}: must be finite and > 0")
    before = [dataclasses.replace(r, arrival_s=r.arrival_s / speed) for r in requests if r.arrival_s < until_s]
    turns = build_turns(before, lambda prompt, output: config.service(prompt, output) / speed)
    if len(turns) < MIN_TRAINING_TURNS:
        return None
    cut = until_s / speed
    spec = scaled_spec(config.features, speed)
    params = dict(config.lightgbm)
    tail = dict(params.get("tail", {}))
    params["tail"] = {**tail, "step_s": float(tail.get("step_s", 60.0)) / speed}
    rows = build_rows(turns, spec)
    model = train_return_model(rows, spec.horizons_s, cut, params, config.validation_fraction)
    return TrainedBefore(model, spec, len(turns), cut, config.recalibration.scaled(speed))


def scaled_spec(spec: ReturnFeatureSpec, speed: float) -> ReturnFeatureSpec:
    """spec's horizons and windows (seconds) on a clock running speed x."""
    if speed == 1.0:
        return spec
    return dataclasses.replace(spec, horizons_s=tuple(h / speed for h in spec.horizons_s),
                               rate_windows_s=tuple(w / speed for w in spec.rate_windows_s),
                               active_window_s=spec.active_window_s / speed,
                               share_window_s=spec.share_window_s / speed)
