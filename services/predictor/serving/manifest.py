"""Model directories: a `manifest.json` that says which model to build and how.

    {"kind": "ewma" | "last-value", "version": "2024-06-01.1",
     "horizons_s": [1, 2, 5, 10], "quantile": 0.9,
     <the kind's parameters, each optional with the defaults in models.py>,
     "metrics": {"mae_1s": 0.42, ...}}

Validation is strict, so a typo cannot silently fall back to a default: an
unknown kind, an unknown key, a key of the wrong type or a value out of range
is InvalidArgument naming the key; a missing directory or manifest is
NotFound; an empty, overlong (MAX_PATH_CHARS) or NUL-holding path and JSON
nested past the parser's limit are InvalidArgument; a manifest the OS will
not let us read is FailedPrecondition. `load_model` only reads and builds; it never touches a model in
service (the core swaps a loaded model in). Kinds whose manifest carries more
than numbers (kind "lightgbm": booster files beside the manifest, see
lgbm_served.py) register a `parse` function and their extra keys; the
lightgbm kind's optional "point" records the served point forecast chosen
per horizon and family class on validation (selection.py), which the model
then serves and GetModelInfo shows, and its optional "compiled" lists the
boosters' compiled libraries (compiled_trees.py): anything wrong there is a
fallback to LightGBM's predict, never a refused model.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from speckv.services.predictor.serving.count_models import CountModel, EwmaModel, EwmaParams, LastValueModel, RateParams

MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux: a longer path cannot name a directory anyway
COMMON_KEYS = ("kind", "version", "horizons_s", "quantile", "metrics")


@dataclasses.dataclass(frozen=True, slots=True)
class ModelKind:
    params_type: type[RateParams]
    build: Callable[[Any, Mapping[str, float], Path], CountModel]  # (params, metrics, directory)
    # (manifest, metrics, directory, version, horizons_s, quantile) -> model, for non-numeric manifests
    parse: Callable[..., CountModel] | None = None
    extra_keys: tuple[str, ...] = ()

    @property
    def param_keys(self) -> tuple[str, ...]:
        if self.parse is not None:
            return self.extra_keys
        return tuple(f.name for f in dataclasses.fields(self.params_type) if f.name not in COMMON_KEYS)


def _parse_lightgbm(*args: Any) -> CountModel:
    from speckv.services.predictor.serving.lgbm_served import load_lightgbm  # lightgbm loads only when used

    return load_lightgbm(*args)


MODEL_KINDS: dict[str, ModelKind] = {
    "ewma": ModelKind(EwmaParams, lambda params, metrics, _dir: EwmaModel(params, metrics)),
    "last-value": ModelKind(RateParams, lambda params, metrics, _dir: LastValueModel(params, metrics)),
    "lightgbm": ModelKind(RateParams, lambda *_: None, parse=_parse_lightgbm,  # type: ignore[arg-type]
                          extra_keys=("features", "feature_spec", "alarm_threshold", "dispersion", "offset",
                                      "trace", "files", "point", "compiled", "burst")),
}


def load_model(path: str | Path) -> CountModel:
    """Reads path/manifest.json, validates it and builds its model."""
    directory = model_directory(path)
    manifest = read_manifest(directory)
    kind_name = manifest.get("kind")
    if not isinstance(kind_name, str) or kind_name not in MODEL_KINDS:
        raise InvalidArgument(f"kind={kind_name!r}: expected one of {', '.join(sorted(MODEL_KINDS))}")
    kind = MODEL_KINDS[kind_name]
    unknown = sorted(set(manifest) - set(COMMON_KEYS) - set(kind.param_keys))
    if unknown:
        raise InvalidArgument(f"{unknown[0]}: unknown key for kind {kind_name!r} "
                              f"(allowed: {', '.join((*COMMON_KEYS, *kind.param_keys))})")
    for key in ("version", "horizons_s", "quantile"):
        if key not in manifest:
            raise InvalidArgument(f"{key}: required key missing from {MANIFEST_NAME}")
    values: dict[str, Any] = {
        "version": _string(manifest, "version"),
        "horizons_s": tuple(_number_list(manifest, "horizons_s")),
        "quantile": _number(manifest, "quantile"),
    }
    if kind.parse is not None:
        probe = RateParams(values["version"], values["horizons_s"], values["quantile"])
        probe.validate()  # version, horizons and quantile as strictly as for every kind
        return kind.parse(manifest, _metrics(manifest), directory, values["version"], values["horizons_s"],
                          values["quantile"])
    values.update({key: _number(manifest, key) for key in kind.param_keys if key in manifest})
    params = kind.params_type(**values)
    params.validate()
    return kind.build(params, _metrics(manifest), directory)


def read_manifest(directory: Path) -> dict[str, Any]:
    """directory/manifest.json as a JSON object. Errors name the file
    relative to the directory (the caller names the directory: ReloadModel
    returns them to a client, who must not learn the server's paths)."""
    file = directory / MANIFEST_NAME
    try:
        if not file.is_file():
            raise NotFound(f"no {MANIFEST_NAME} in the model directory")
        if not Path(os.path.realpath(file)).is_relative_to(os.path.realpath(directory)):
            # as for the boosters it names: a symlink out would read a file the model root does not hold
            raise InvalidArgument(f"{MANIFEST_NAME}: leads outside the model directory (a symlink); refused")
        if file.stat().st_size > MAX_MANIFEST_BYTES:
            raise InvalidArgument(f"{MANIFEST_NAME}: larger than {MAX_MANIFEST_BYTES} bytes")
        text = file.read_text(encoding="utf-8")
    except OSError as exc:  # unreadable (permissions, a FIFO, IO error): the directory's state, not a bug
        # strerror, not str(exc): that one names the file by its absolute path
        raise FailedPrecondition(f"{MANIFEST_NAME}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{MANIFEST_NAME}: not valid UTF-8: {exc}") from None
    try:
        manifest = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"{MANIFEST_NAME}: not valid JSON: {exc}") from None
    except RecursionError:  # deeply nested JSON: the parser's recursion limit, not a bug of ours
        raise InvalidArgument(f"{MANIFEST_NAME}: JSON nested too deeply") from None
    if not isinstance(manifest, dict):
        raise InvalidArgument(f"{MANIFEST_NAME}: the manifest must be a JSON object")
    return manifest


def write_manifest(directory: str | Path, manifest: Mapping[str, Any]) -> Path:
    """Writes manifest.json atomically (temp file + rename), creating the directory."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    temp = target / (MANIFEST_NAME + ".tmp")
    temp.write_text(json.dumps(dict(manifest), indent=2, sort_keys=True), encoding="utf-8")
    temp.replace(target / MANIFEST_NAME)
    return target / MANIFEST_NAME


def model_directory(path: str | Path) -> Path:
    """path as a model directory: InvalidArgument when empty, longer than
    MAX_PATH_CHARS or holding a NUL (the OS would refuse it with an error
    that is not ours); NotFound when no such directory exists."""
    text = str(path)
    if not text.strip():
        raise InvalidArgument("path: empty (name a model directory)")
    if len(text) > MAX_PATH_CHARS:
        raise InvalidArgument(f"path: {len(text)} characters, at most {MAX_PATH_CHARS}")
    if "\x00" in text:
        raise InvalidArgument("path: holds a NUL character")
    directory = Path(path)
    try:
        is_dir = directory.is_dir()
    except OSError as exc:  # ENAMETOOLONG (a component over 255 bytes), EACCES, ...: the caller's path
        raise InvalidArgument(f"path: cannot be a model directory ({exc.strerror})") from None
    if not is_dir:
        raise NotFound(f"path={str(path)!r}: no such model directory")
    return directory


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(manifest: Mapping[str, Any], key: str) -> float:
    value = manifest[key]
    if not _is_number(value):
        raise InvalidArgument(f"{key}={value!r}: must be a finite number")
    return float(value)


def _number_list(manifest: Mapping[str, Any], key: str) -> list[float]:
    value = manifest[key]
    if not isinstance(value, list) or not all(_is_number(v) for v in value):
        raise InvalidArgument(f"{key}={value!r}: must be a list of finite numbers")
    return [float(v) for v in value]


def _string(manifest: Mapping[str, Any], key: str) -> str:
    value = manifest[key]
    if not isinstance(value, str):
        raise InvalidArgument(f"{key}={value!r}: must be a string")
    return value


def _metrics(manifest: Mapping[str, Any]) -> dict[str, float]:
    value = manifest.get("metrics", {})
    if not isinstance(value, dict):
        raise InvalidArgument(f"metrics={value!r}: must be an object of name -> number")
    for name, metric in value.items():
        if not _is_number(metric):
            raise InvalidArgument(f"metrics.{name}={metric!r}: must be a finite number")
    return {str(name): float(metric) for name, metric in value.items()}
