"""The LightGBM forecaster as a served CountModel, and its model directory.

Directory layout: manifest.json plus one LightGBM text model file per
horizon: count_h1.txt, count_h5.txt, ... The manifest holds kind "lightgbm",
version, horizons_s, quantile, features (the names, which must equal the
names the feature_spec derives), feature_spec, alarm_threshold and
dispersion (one per horizon), offset (the level offset of lgbm.py:
halflife_s, prior_per_step, prior_steps), trace (what it was trained on),
files and metrics. Loading checks every file parses and expects exactly
those features.

Serving: features come from the core's OnlineFeatures (state.features), as of
the last complete step. Families never seen read as a fresh family (all
family features zero, cluster and time terms current), so their forecast is
the model's own prior for a newcomer. A requested horizon the model was not
trained for uses the nearest trained one at or above it (else the longest),
its expected and upper counts scaled by h / h_trained; its burst probability
is taken as is.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import lightgbm as lgb
import numpy as np

from speckv.services.common.errors import InvalidArgument
from speckv.services.predictor.features import FeatureSpec
from speckv.services.predictor.lgbm import KINDS, LevelOffset, LgbmBundle
from speckv.services.predictor.models import BURST_DEFINITION, HISTORY_HALFLIVES, CountForecast, SeriesState

EXTRA_KEYS = ("features", "feature_spec", "alarm_threshold", "dispersion", "offset", "trace", "files")


class LightGbmModel:
    name = "lightgbm"

    def __init__(self, bundle: LgbmBundle, version: str, metrics: Mapping[str, float] | None = None,
                 trace: str = "") -> None:
        self.bundle = bundle
        self.version = version
        self.horizons_s = bundle.horizons_s
        self.quantile = bundle.quantile
        self.features = bundle.spec.names()
        self.metrics = dict(metrics or {})
        self.trace = trace
        s = bundle.spec
        self.burst_definition = (f"{BURST_DEFINITION} Here burst_ratio={s.burst_ratio:g}, "
                                 f"min_burst_count={s.min_burst_count:g}, long_halflife_s={s.long_halflife_s:g} "
                                 "(discrete exposure-corrected EWMA of the features).")

    @property
    def feature_spec(self) -> FeatureSpec:
        return self.bundle.spec

    @property
    def history_s(self) -> float:
        s = self.bundle.spec
        return max(s.ring * s.step_s, HISTORY_HALFLIVES * max((*s.halflives_s, s.long_halflife_s)))

    def forecast(self, state: SeriesState, now_s: float, horizons: np.ndarray) -> CountForecast:
        if state.features is None:
            raise InvalidArgument("the lightgbm model needs the core's online features")
        X = state.features.features(state.rows)
        expected, upper, prob = self.bundle.predict(X)
        trained = np.asarray(self.horizons_s)
        asked = np.asarray(horizons, dtype=np.float64)
        col = np.minimum(np.searchsorted(trained, asked - 1e-9), len(trained) - 1)
        scale = (asked / trained[col])[None, :]
        return CountForecast(expected[:, col] * scale, upper[:, col] * scale, prob[:, col])


def save_model(directory: str | Path, model: LightGbmModel) -> Path:
    """Writes the booster files, then the manifest (atomically, last)."""
    from speckv.services.predictor.manifest import write_manifest

    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[str]] = {}
    for kind in KINDS:
        files[kind] = []
        for h, booster in zip(model.horizons_s, model.bundle.boosters[kind]):
            name = f"{kind}_h{h:g}.txt"
            booster.save_model(str(target / name))
            files[kind].append(name)
    return write_manifest(target, {
        "kind": "lightgbm", "version": model.version, "horizons_s": list(model.horizons_s),
        "quantile": model.quantile, "metrics": model.metrics, "features": list(model.features),
        "feature_spec": model.bundle.spec.to_dict(), "alarm_threshold": list(model.bundle.alarm_threshold),
        "dispersion": list(model.bundle.dispersion), "offset": _offset_dict(model.bundle.offset),
        "trace": model.trace, "files": files})


def _offset_dict(offset: LevelOffset) -> dict[str, float]:
    return {"halflife_s": offset.halflife_s, "prior_per_step": offset.prior_per_step,
            "prior_steps": offset.prior_steps}


def _parse_offset(value: Any, spec: FeatureSpec) -> LevelOffset:
    keys = ("halflife_s", "prior_per_step", "prior_steps")
    if not isinstance(value, dict) or sorted(value) != sorted(keys):
        raise InvalidArgument(f"offset: must be an object with exactly {', '.join(keys)}")
    for key in keys:
        v = value[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise InvalidArgument(f"offset.{key}={v!r}: must be a finite number >= 0")
    offset = LevelOffset(float(value["halflife_s"]), float(value["prior_per_step"]), float(value["prior_steps"]))
    try:
        offset.column(spec)
    except ValueError as exc:
        raise InvalidArgument(f"offset.halflife_s: {exc}") from None
    return offset


def _per_horizon(manifest: Mapping[str, Any], key: str, horizons: int, low: float, high: float) -> list[float]:
    values = manifest[key]
    if not isinstance(values, list) or len(values) != horizons:
        raise InvalidArgument(f"{key}: must list one number per horizon")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (low <= v <= high):
            raise InvalidArgument(f"{key}: {v!r} is not a number in [{low:g}, {high:g}]")
    return [float(v) for v in values]


def load_lightgbm(manifest: Mapping[str, Any], metrics: Mapping[str, float], directory: Path,
                  version: str, horizons_s: tuple[float, ...], quantile: float) -> LightGbmModel:
    for key in EXTRA_KEYS:
        if key not in manifest:
            raise InvalidArgument(f"{key}: required key missing for kind 'lightgbm'")
    try:
        spec = FeatureSpec.from_dict(manifest["feature_spec"])
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"feature_spec: {exc}") from None
    if list(manifest["features"]) != list(spec.names()):
        raise InvalidArgument("features: do not match the names feature_spec derives")
    thresholds = _per_horizon(manifest, "alarm_threshold", len(horizons_s), 0.0, 1.0)
    dispersion = _per_horizon(manifest, "dispersion", len(horizons_s), 0.0, 1e6)
    offset = _parse_offset(manifest["offset"], spec)
    files = manifest["files"]
    boosters: dict[str, list[lgb.Booster]] = {}
    for kind in KINDS:
        names = files.get(kind) if isinstance(files, dict) else None
        if not isinstance(names, list) or len(names) != len(horizons_s):
            raise InvalidArgument(f"files.{kind}: must list one model file per horizon")
        boosters[kind] = [_booster(directory, name, len(spec.names()), f"files.{kind}") for name in names]
    bundle = LgbmBundle(spec, horizons_s, quantile, boosters, thresholds, offset, dispersion)
    return LightGbmModel(bundle, version, metrics, str(manifest["trace"]))


def _booster(directory: Path, name: Any, num_features: int, key: str) -> lgb.Booster:
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        raise InvalidArgument(f"{key}: {name!r} is not a file name in the model directory")
    path = directory / name
    if not path.is_file():
        raise InvalidArgument(f"{key}: {path} does not exist")
    try:
        booster = lgb.Booster(model_file=str(path))
    except lgb.basic.LightGBMError as exc:
        raise InvalidArgument(f"{key}: {path} is not a LightGBM model ({exc})") from None
    if booster.num_feature() != num_features:
        raise InvalidArgument(f"{key}: {path} expects {booster.num_feature()} features, the spec gives {num_features}")
    return booster
