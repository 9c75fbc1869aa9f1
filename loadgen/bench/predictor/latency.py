"""Forecast latency through the predictor core with a LightGBM model in it,
with the compiled trees and with LightGBM's predict, in the same run (issue
22, item 4).

The trained model is written as a model directory (save_model: boosters,
compiled trees, manifest) and loaded back, as the service loads it. A second
core serves the same model with its compiled trees dropped: LightGBM's
predict, the fallback. 10,000 families each get Poisson arrivals over the
last two minutes (rates spread log-uniformly over 0.01..5 /s, so some are
idle, some busy), the same in both cores. Forecast is timed for the first 1,
1,000 and 10,000 families in one call each, median of REPEATS calls, the two
paths alternating call by call so that they share the machine's load; the
CPU time of the 10,000-family call (both threads' work) beside it. The two
answers for all 10,000 families are compared bit for bit.

Breakdown of the compiled 10,000-family forecast (`breakdown_ms_10k`), each
part timed alone on one thread on the same rows, median of REPEATS calls:
the whole forecast, the features, the count trees, the level-free features
and trees, the count distribution (upper quantile, and the burst
probability at the horizons that serve the distribution's), the burst
classifiers' trees and sigmoid (burst_model.py, at the horizons that serve
them), and the model's whole predict. What no call timed is kept apart
(`breakdown_derived_ms_10k`), as differences of those medians, never as
parts: `model_rest` = predict less its timed parts (level offset,
baselines, classes, blend), `core_rest` = the forecast less predict and
the features (family lookup and checks, the request's answer). A median of
a difference is not the difference of medians, so these are estimates,
and may even come out negative.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time
from typing import Callable

import numpy as np

from speckv.services.common.clock import ManualClock
from speckv.services.predictor.fitting.lgbm_save import save_model
from speckv.services.predictor.serving import negbin
from speckv.services.predictor.serving.burst_choice import BURST_KIND, CLASSIFIER, probability
from speckv.services.predictor.serving.core import PredictorCore, PredictorSettings
from speckv.services.predictor.serving.level_free import LevelFreeRows
from speckv.services.predictor.serving.lgbm_bundle import LEVEL_FREE_KIND, LgbmBundle
from speckv.services.predictor.serving.lgbm_served import LightGbmModel
from speckv.services.predictor.serving.manifest import load_model
from speckv.services.predictor.serving.observations import Arrival
from speckv.services.predictor.serving.targets import burst_threshold

FAMILIES = 10_000
SIZES = (1, 1_000, 10_000)
WINDOW_S = 600.0  # the service's default window
REPEATS = 15
NOW = 10_000.0


def forecast_latency(bundle: LgbmBundle, step_s: float, families: int = FAMILIES) -> dict:
    """The figures of the module docstring, milliseconds (compile_s: seconds to write the model directory)."""
    with tempfile.TemporaryDirectory(prefix="speckv-latency-") as directory:
        began = time.perf_counter()
        save_model(directory, LightGbmModel(bundle, "bench"))
        compile_s = time.perf_counter() - began
        compiled = load_model(directory)
    assert isinstance(compiled, LightGbmModel)
    fallback = LightGbmModel(dataclasses.replace(compiled.bundle, compiled=None), "bench",
                             inference="lightgbm predict (the bench's reference)")
    names = [f"family-{i}" for i in range(families)]
    arrivals = _arrivals(names)
    cores = {"compiled": _core(compiled, step_s, arrivals), "lightgbm": _core(fallback, step_s, arrivals)}
    a, b = cores["compiled"].forecast(names), cores["lightgbm"].forecast(names)
    identical = all(_same_bits(getattr(a, k), getattr(b, k)) for k in ("expected", "upper", "burst_probability"))
    wall: dict[str, dict[str, list[float]]] = {path: {str(n): [] for n in SIZES} for path in cores}
    cpu: dict[str, list[float]] = {path: [] for path in cores}
    for _ in range(REPEATS):
        for n in SIZES:
            for path, core in cores.items():
                w, c = _timed(lambda: core.forecast(names[:n]))
                wall[path][str(n)].append(w)
                if n == SIZES[-1]:
                    cpu[path].append(c)
    out = {"inference": compiled.inference, "identical": identical, "compile_s": compile_s,
           "forecast_ms": {p: {n: statistics.median(v) for n, v in per.items()} for p, per in wall.items()},
           "forecast_cpu_ms_10k": {p: statistics.median(v) for p, v in cpu.items()},
           **_breakdown(cores["compiled"], compiled, names)}
    out["forecast_ms_1"] = out["forecast_ms"]["compiled"]["1"]
    out["forecast_ms_10k"] = out["forecast_ms"]["compiled"][str(SIZES[-1])]
    return out


def _arrivals(names: list[str]) -> list[Arrival]:
    rng = np.random.default_rng(3)
    rates = np.exp(rng.uniform(np.log(0.01), np.log(5.0), len(names)))
    counts = rng.poisson(rates * 120.0)
    fam = np.repeat(np.arange(len(names)), counts)
    times = rng.uniform(NOW - 120.0, NOW, len(fam))
    return [Arrival(float(times[i]), names[fam[i]]) for i in np.argsort(times, kind="stable").tolist()]


def _core(model: LightGbmModel, step_s: float, arrivals: list[Arrival]) -> PredictorCore:
    window_s = step_s * math.ceil(max(WINDOW_S, model.history_s) / step_s)  # coarse bins read more seconds
    core = PredictorCore(ManualClock(NOW), model, PredictorSettings(step_s=step_s, window_s=window_s))
    core.observe(arrivals)
    core.forecast([arrivals[0].family])  # takes in the completed steps once
    return core


def _breakdown(core: PredictorCore, model: LightGbmModel, names: list[str]) -> dict[str, dict[str, float]]:
    """The parts of a compiled forecast of every family, each timed on one
    thread, and the remainders derived from them (module docstring)."""
    bundle = model.bundle
    state = core._state(core._series.rows_of(names), NOW)  # noqa: SLF001 - the rows the forecast reads
    assert state.features is not None
    X = state.features.features(state.rows)
    base = bundle.offset.base(X, bundle.spec)
    mean = bundle.mean(X, num_threads=1)
    level = bundle.level_per_s(X)
    ks = bundle.steps()

    def level_free() -> None:
        if LEVEL_FREE_KIND in bundle.boosters and bundle.baselines is not None:
            rows = LevelFreeRows(X, bundle.spec, base, bundle.baselines)
            for i, k in enumerate(ks):
                bundle._raw(LEVEL_FREE_KIND, i, rows.at(k), 1)  # noqa: SLF001 - one part alone

    classifier = [bundle.burst is not None and bundle.burst.sources[i] == CLASSIFIER for i in range(len(ks))]

    def distribution() -> None:
        for i, h in enumerate(bundle.horizons_s):
            negbin.quantile(bundle.quantile, mean[:, i], bundle.dispersion[i])
            if not classifier[i]:
                threshold = burst_threshold(level, h, bundle.spec.burst_ratio, bundle.spec.min_burst_count)
                negbin.exceed_probability(threshold, mean[:, i], bundle.dispersion[i])

    def burst_trees() -> None:
        for i in range(len(ks)):
            if classifier[i]:
                probability(bundle._raw(BURST_KIND, i, X, 1))  # noqa: SLF001 - one part alone

    threads, model.threads = model.threads, 1
    try:
        one_thread = _median(lambda: core.forecast(names))
    finally:
        model.threads = threads
    parts = {
        "features": _median(lambda: state.features.features(state.rows)),
        "count_trees": _median(lambda: [bundle._raw("count", i, X, 1) for i in range(len(ks))]),  # noqa: SLF001
        "level_free": _median(level_free),
        "distribution": _median(distribution),
        "burst_trees": _median(burst_trees),
    }
    predict = parts["predict"] = _median(lambda: bundle.predict(X, num_threads=1))
    parts["forecast_one_thread"] = one_thread
    derived = {"model_rest": predict - parts["count_trees"] - parts["level_free"] - parts["distribution"]
               - parts["burst_trees"],
               "core_rest": one_thread - predict - parts["features"]}
    return {"breakdown_ms_10k": parts, "breakdown_derived_ms_10k": derived}


def _median(call: Callable[[], object]) -> float:
    return statistics.median(_timed(call)[0] for _ in range(REPEATS))


def _timed(call: Callable[[], object]) -> tuple[float, float]:
    """(wall ms, CPU ms of this process) of one call."""
    began, cpu = time.perf_counter(), time.process_time()
    call()
    return (time.perf_counter() - began) * 1e3, (time.process_time() - cpu) * 1e3


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a, dtype=np.float64), np.ascontiguousarray(b, dtype=np.float64)
    return a.shape == b.shape and bool((a.view(np.int64) == b.view(np.int64)).all())

