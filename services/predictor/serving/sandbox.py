"""Probe a candidate model directory in a separate process before serving it.

A LightGBM model file is parsed and evaluated by native code: a crafted or
damaged booster (an out-of-range child index, garbage trees) can abort or
segfault the process that loads it, and a model directory's compiled trees
(compiled_trees.py) are shared libraries whose code runs in the process that
loads them. ReloadModel therefore loads and exercises a candidate first in
a child process (multiprocessing, spawn context: a fresh interpreter, no
state or locks inherited from the server's threads) and only a candidate
that loads there and predicts finite values on a small dummy feature matrix
is loaded by the server itself. Loading runs the compiled trees (each is
checked against LightGBM's predict on its check rows) and the forecast of
the dummy matrix runs them again, so a library that crashes kills the
probe: a refused reload, never a dead predictor. A library that loads but
differs from LightGBM's predict is no crash: the model loads with LightGBM's
predict, here and in the server alike (its ModelInfo says so).

Outcomes, as domain errors (the interceptor maps them to status codes):
- the child's own domain error (InvalidArgument, NotFound, ...) is raised
  again in the parent with its message: a malformed manifest is a malformed
  request wherever it is found;
- the child dies (signal, abort, non-zero exit), answers nothing within
  timeout_s, or finds non-finite outputs: FailedPrecondition, the message
  says which.

The probe costs one interpreter start plus the model load (about a second
with lightgbm); a reload is rare, so that is paid on every one.

Left open: the files are read twice (child, then parent); a directory
rewritten between the two reads is loaded unprobed. Model roots written
only by trusted trainers (write_manifest renames the manifest in last) make
that a non-issue in practice.
"""
from __future__ import annotations

import math
import multiprocessing
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from speckv.services.common import errors
from speckv.services.common.errors import FailedPrecondition, SpeckvError

PROBE_ROWS = 16  # rows of the dummy feature matrix
PROBE_SEED = 0
# The probe's own core (_exercise_core): a few families' arrivals over the last PROBE_WINDOW_S seconds
PROBE_NOW_S = 100_000.0
PROBE_WINDOW_S = 300.0
PROBE_ARRIVALS = 600
PROBE_FAMILIES = 4

# Domain errors the child may report, by name; anything else is a failed probe.
_DOMAIN_ERRORS: dict[str, type[SpeckvError]] = {
    cls.__name__: cls for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, SpeckvError) and cls is not SpeckvError
}


def probe_features(num_features: int) -> np.ndarray:
    """The dummy matrix, (PROBE_ROWS, num_features) float64: a zero row (a
    newcomer's features) and rows of small non-negative values (counts,
    rates), so the boosters walk more than one path."""
    rng = np.random.default_rng(PROBE_SEED)
    X = rng.gamma(1.0, 3.0, size=(PROBE_ROWS, num_features))
    X[0] = 0.0
    return X


def exercise(path: str) -> None:
    """Loads path (its compiled trees too, where it has them) and, for a
    model that reads features, forecasts the dummy matrix at every horizon
    it serves; FailedPrecondition on a non-finite output. Runs in the probe
    process (also callable in-process, in tests, on trusted directories)."""
    from speckv.services.predictor.serving.manifest import load_model  # the child imports only what it needs

    model = load_model(path)
    forecast_features = getattr(model, "forecast_features", None)
    if forecast_features is None:  # pure-Python kinds: loading validated everything they read
        return
    X = probe_features(len(model.features))
    out = forecast_features(X, np.asarray(model.horizons_s, dtype=np.float64))
    for name in ("expected", "upper", "burst_probability"):
        values = np.asarray(getattr(out, name))
        if values.shape[0] != PROBE_ROWS or not np.isfinite(values).all():
            raise FailedPrecondition(f"candidate model: {name} is not finite on the probe matrix")
    _exercise_core(model, path)


def _exercise_core(model: Any, path: str) -> None:
    """Serves the model from a core of its own as the server would: online
    features built from its feature_spec over a few families' arrivals,
    then Forecast and the top-k. The dummy matrix above skips the online
    features, so a spec that validates but breaks them (a wrongly typed
    field; found by `speckv bench predictor --crafted`) would otherwise
    pass here and fail every Forecast in the server."""
    from speckv.services.common.clock import ManualClock
    from speckv.services.predictor.serving.core import PredictorCore, PredictorSettings
    from speckv.services.predictor.serving.observations import Arrival

    spec = getattr(model, "feature_spec", None)
    if spec is None:  # a model that reads no online features: the dummy matrix was its whole path
        return
    window_s = spec.step_s * math.ceil(max(PROBE_WINDOW_S, model.history_s) / spec.step_s)
    settings = PredictorSettings(step_s=spec.step_s, window_s=window_s, max_horizon_s=max(model.horizons_s))
    core = PredictorCore(ManualClock(PROBE_NOW_S), model, settings, source=path)
    rng = np.random.default_rng(PROBE_SEED)
    times = np.sort(rng.uniform(PROBE_NOW_S - PROBE_WINDOW_S, PROBE_NOW_S, PROBE_ARRIVALS))
    core.observe(Arrival(time_s=float(t), family=f"probe-{i % PROBE_FAMILIES}") for i, t in enumerate(times))
    families = [f"probe-{i}" for i in range(PROBE_FAMILIES)] + ["probe-never-seen"]
    for result in (core.forecast(families), core.top_families(PROBE_FAMILIES)):
        for name in ("expected", "upper", "burst_probability"):
            if not np.isfinite(np.asarray(getattr(result, name))).all():
                raise FailedPrecondition(f"candidate model: {name} is not finite serving probe arrivals")


def _child(path: str, conn: Connection) -> None:
    """Probe-process entry: sends ("ok", "", "") or (kind, error name, message)."""
    try:
        exercise(path)
        conn.send(("ok", "", ""))
    except SpeckvError as exc:
        conn.send(("domain", type(exc).__name__, str(exc)))
    except BaseException as exc:  # noqa: BLE001 - anything the candidate raises is a refusal, reported
        conn.send(("error", type(exc).__name__, str(exc)))
    finally:
        conn.close()


def probe_model(path: str | Path, timeout_s: float, shown: str = "") -> None:
    """Returns when the model at path loads and predicts finite values in a
    separate process within timeout_s seconds; raises otherwise (module
    docstring). Never lets the candidate run in this process. Errors name
    the candidate `shown` (ReloadModel: the name its caller gave, never the
    server's path); empty: by its path."""
    label = shown or f"at {path}"
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s={timeout_s}: must be finite and > 0")
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(str(path), sender), name="predictor-model-probe", daemon=True)
    process.start()
    sender.close()  # the child holds the only writer: EOF as soon as it dies
    try:
        if not receiver.poll(timeout_s):
            raise FailedPrecondition(f"candidate model {label}: the probe did not load and predict within "
                                     f"{timeout_s:g} s; the model in service is kept")
        try:
            kind, name, message = receiver.recv()
        except (EOFError, OSError):
            process.join(5.0)
            raise FailedPrecondition(f"candidate model {label}: the probe process died loading or predicting "
                                     f"with it ({_exit_reason(process.exitcode)}); the model in service is "
                                     "kept") from None
    finally:
        receiver.close()
        if process.is_alive():
            process.kill()
        process.join(5.0)
    if kind == "domain" and name in _DOMAIN_ERRORS:
        raise _DOMAIN_ERRORS[name](message)
    if kind != "ok":
        raise FailedPrecondition(f"candidate model {label}: the probe failed ({name}: {message}); "
                                 "the model in service is kept")


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"
