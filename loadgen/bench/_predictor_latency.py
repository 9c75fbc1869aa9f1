"""Forecast latency through the predictor core with a LightGBM model in it.

10,000 families each get Poisson arrivals over the last two minutes (rates
spread log-uniformly over 0.01..5 /s, so some are idle, some busy), then
Forecast is timed for all of them in one call and for one family (median of
REPEATS calls). The ceiling beside it: one raw Booster.predict per booster the served
forecast reads (every count booster; a level-free one where the selection
uses it, on its level-free features computed outside the timing) on the
same 10,000 feature rows, with no dedupe and no core around it.
"""
from __future__ import annotations

import math
import statistics
import time

import numpy as np

from speckv.services.common.clock import ManualClock
from speckv.services.predictor.core import PredictorCore, PredictorSettings
from speckv.services.predictor.level_free import level_free_features
from speckv.services.predictor.lgbm_forecaster import LEVEL_FREE, LEVEL_FREE_KIND, LgbmBundle
from speckv.services.predictor.lgbm_served import LightGbmModel
from speckv.services.predictor.observations import Arrival

FAMILIES = 10_000
WINDOW_S = 600.0  # the service's default window
REPEATS = 7
NOW = 10_000.0


def forecast_latency(bundle: LgbmBundle, step_s: float, families: int = FAMILIES) -> dict[str, float]:
    clock = ManualClock(NOW)
    model = LightGbmModel(bundle, "bench")
    window_s = step_s * math.ceil(max(WINDOW_S, model.history_s) / step_s)  # coarse bins read more seconds
    core = PredictorCore(clock, model, PredictorSettings(step_s=step_s, window_s=window_s))
    rng = np.random.default_rng(3)
    rates = np.exp(rng.uniform(np.log(0.01), np.log(5.0), families))
    counts = rng.poisson(rates * 120.0)
    fam = np.repeat(np.arange(families), counts)
    times = rng.uniform(NOW - 120.0, NOW, len(fam))
    order = np.argsort(times, kind="stable")
    names = [f"family-{i}" for i in range(families)]
    core.observe(Arrival(float(times[i]), names[fam[i]]) for i in order.tolist())
    core.forecast(names)  # takes in the completed steps once
    many = _median_ms(lambda: core.forecast(names))
    one = _median_ms(lambda: core.forecast(names[:1]))
    X = core._features.online.features(np.arange(families))  # noqa: SLF001 - same rows the forecast read
    inputs = [(b, X) for b in bundle.boosters["count"]]
    if LEVEL_FREE_KIND in bundle.boosters and bundle.selection is not None and bundle.baselines is not None:
        base = bundle.offset.base(X, bundle.spec)
        inputs += [(b, level_free_features(X, bundle.spec, base, bundle.baselines, k))
                   for i, (b, k) in enumerate(zip(bundle.boosters[LEVEL_FREE_KIND], bundle.steps()))
                   if LEVEL_FREE in bundle.selection.needed(i)]
    ceiling = _median_ms(lambda: [b.predict(Z, num_threads=2) for b, Z in inputs])
    return {"forecast_ms_10k": many, "forecast_ms_1": one, "ceiling_predict_ms_10k": ceiling}


def _median_ms(call) -> float:
    samples = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        call()
        samples.append((time.perf_counter() - began) * 1e3)
    return statistics.median(samples)
