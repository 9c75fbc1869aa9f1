"""The predictor model of one end-to-end comparison: LightGBM trained on the
`warmup_s` of trace just before the replayed slice (never on the slice),
once, and loaded (ReloadModel) into
every policy's fresh predictor, so `predictive` never sees the slice and every
run forecasts with the same model.

Clock domain: the live predictor observes arrivals on the services' wall
clock, on which the replay compresses trace time `speed` x. The training
arrivals are therefore stamped trace_s / speed, so the model's steps, lags
and horizons mean what they will mean in the run (a 2 s horizon at speed 2
covers 4 s of trace, as the run's forecasts do). Families are keyed exactly
as the router keys them (the trace requests carry their family).

Training uses the `quick` hyperparameters of services/config/predictor.json
when asked (the --quick comparison), the full ones otherwise.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from speckv.loadgen.experiments.e2e_config import SliceSpec
from speckv.services.common.errors import FailedPrecondition
from speckv.services.common.traces import TraceRequest
from speckv.services.predictor.fitting.family_counts import FamilyCounts, aggregate
from speckv.services.predictor.fitting.lgbm_save import save_model
from speckv.services.predictor.fitting.training import load_config, train_on_counts
from speckv.services.predictor.serving.lgbm_served import LightGbmModel

# Below this much pre-slice trace the model could not learn a return pattern.
MIN_TRAIN_TRACE_S = 120.0


@dataclass(frozen=True, slots=True)
class TrainedModel:
    directory: Path
    version: str
    requests: int  # pre-slice requests trained on
    families: int
    trace_span_s: tuple[float, float]  # [first, end) trace seconds trained on
    train_s: float  # wall seconds the training took
    rows: int

    def describe(self) -> str:
        lo, hi = self.trace_span_s
        return (f"LightGBM {self.version} trained on trace time [{lo:g}, {hi:g}) s ({self.requests} requests, "
                f"{self.families} families, {self.rows} rows, {self.train_s:.1f} s to train), strictly before "
                "the slice; stamped on the replay's compressed clock; the same model for every policy")


def train_before_slice(trace: Sequence[TraceRequest], slice_: SliceSpec, directory: Path,
                       quick: bool, window_s: float) -> TrainedModel:
    """Trains on the requests arriving in [slice start - window_s, slice
    start) and writes the model directory; FailedPrecondition when too little
    trace precedes the slice."""
    first_s = max(0.0, slice_.start_s - window_s)
    before = [r for r in trace if first_s <= r.arrival_s < slice_.start_s]
    if not before or slice_.start_s - first_s < MIN_TRAIN_TRACE_S:
        raise FailedPrecondition(f"the slice starts at {slice_.start_s:g} s: the predictor needs at least "
                                 f"{MIN_TRAIN_TRACE_S:g} s of trace before it to train on")
    config = load_config(quick=quick)
    began = time.perf_counter()
    times = np.array([r.arrival_s / slice_.speed for r in before])
    counts = aggregate(times, [r.family for r in before], config.step_s, start_s=first_s / slice_.speed,
                       end_s=slice_.start_s / slice_.speed)
    keep = np.flatnonzero(np.diff(counts.counts.indptr) > 0)
    counts = FamilyCounts([counts.families[i] for i in keep], counts.counts[keep], counts.step_s, counts.start_s)
    result = train_on_counts(counts, config)
    version = f"e2e-before-{slice_.start_s:g}s-x{slice_.speed:g}{'-quick' if quick else ''}"
    span = (first_s, slice_.start_s)
    save_model(directory, LightGbmModel(result.bundle, version, {"train_s": result.bundle.train_s},
                                        trace=f"trace [{span[0]:g}, {span[1]:g}) s / speed {slice_.speed:g}"))
    return TrainedModel(directory, version, len(before), len(counts.families), span,
                        time.perf_counter() - began, len(result.rows))
