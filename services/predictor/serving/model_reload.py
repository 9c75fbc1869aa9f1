"""ReloadModel's domain step: a model directory named under the core's
model root, probed in a separate process, loaded and swapped into the core.

Outside core.py because the probe process serves the candidate from a core
of its own (sandbox.py imports core.py): the core swaps models in
(PredictorCore.install), this module decides which directory is loaded.
"""
from __future__ import annotations

from speckv.services.predictor.serving.core import ModelInfoRecord, PredictorCore
from speckv.services.predictor.serving.manifest import load_model
from speckv.services.predictor.serving.model_root import resolve_model_name
from speckv.services.predictor.serving.sandbox import probe_model


def reload_model(core: PredictorCore, name: str) -> ModelInfoRecord:
    """Loads the model directory `name` under settings.model_root and
    swaps it in; on any error the model in service stays and the error
    propagates. Only a directory that resolves under the root is read
    (model_root.py: a bad name or a root escape is refused before any
    process starts). The candidate is first loaded and exercised in a
    probe process (sandbox.py): a booster that crashes the native library
    kills the probe, not the predictor, and is FailedPrecondition. The
    model's source is the resolved directory."""
    directory = resolve_model_name(core.settings.model_root, name)
    probe_model(directory, core.settings.reload_probe_timeout_s)
    model = load_model(directory)  # off the lock: file IO and validation
    core.install(model, str(directory))
    return core.model_info()
