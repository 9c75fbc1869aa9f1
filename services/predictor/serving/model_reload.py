"""ReloadModel's domain step: a model directory named under the core's
model root, probed in a separate process, loaded and swapped into the core.

Outside core.py because the probe process serves the candidate from a core
of its own (sandbox.py imports core.py): the core swaps models in
(PredictorCore.install), this module decides which directory is loaded.

Errors name the model by the name the caller gave ('model NAME: ...' where
the message did not already), never by the server's paths (the root, the resolved directory): the admin calling ReloadModel
learns what is wrong with the model, not where the server keeps it. Each
module on the way already names files relative to the model directory; a
message that still holds one of the server's paths (an OS or library
message quoting it) has it replaced here, and the original error is kept
as the raised error's __cause__ for the server's log (servicer.py).
"""
from __future__ import annotations

import os

from speckv.services.common.errors import SpeckvError
from speckv.services.predictor.serving.core import ModelInfoRecord, PredictorCore
from speckv.services.predictor.serving.manifest import load_model
from speckv.services.predictor.serving.model_root import resolve_model_name, shown_name
from speckv.services.predictor.serving.sandbox import probe_model

ROOT_SHOWN = "<model root>"  # what a client reads in place of the root's path


def reload_model(core: PredictorCore, name: str) -> ModelInfoRecord:
    """Loads the model directory `name` under settings.model_root and
    swaps it in; on any error the model in service stays and the error
    propagates, holding none of the server's paths (module docstring).
    Only a directory that resolves under the root is read (model_root.py:
    a bad name or a root escape is refused before any process starts).
    The candidate is first loaded and exercised in a probe process
    (sandbox.py): a booster that crashes the native library kills the
    probe, not the predictor, and is FailedPrecondition. The model's
    source is the resolved directory."""
    root = core.settings.model_root
    try:
        directory = resolve_model_name(root, name)
        probe_model(directory, core.settings.reload_probe_timeout_s, shown=repr(name))
        model = load_model(directory)  # off the lock: file IO and validation
    except SpeckvError as exc:
        shown = without_server_paths(str(exc), root, name)
        if repr(shown_name(name)) not in shown:  # a manifest's or booster's error names its file within the directory
            shown = f"model {shown_name(name)!r}: {shown}"
        if shown == str(exc):
            raise
        raise type(exc)(shown) from exc
    core.install(model, str(directory))
    return core.model_info()


def without_server_paths(message: str, root: str, name: str) -> str:
    """message with every spelling of the root's path (as configured,
    absolute, real) replaced by ROOT_SHOWN, so root/name reads
    '<model root>/name'. Only absolute spellings are replaced: a relative
    root ('models') could be a word of the message, and tells a client
    nothing about the server's file system."""
    if not root:
        return message
    spellings = {os.path.abspath(root), os.path.realpath(root), os.path.normpath(root)}
    for path in sorted((p for p in spellings if os.path.isabs(p) and p != os.sep), key=len, reverse=True):
        message = message.replace(path, ROOT_SHOWN)
    return message
