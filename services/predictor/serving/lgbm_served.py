"""The LightGBM forecaster as a served CountModel, and its model directory.

Directory layout: manifest.json plus one LightGBM text model file per
horizon: count_h1.txt, count_h5.txt, ... The manifest holds kind "lightgbm",
version, horizons_s, quantile, features (the names, which must equal the
names the feature_spec derives), feature_spec, alarm_threshold and
dispersion (one per horizon), offset (the level offset of lgbm.py:
halflife_s, prior_per_step, prior_steps), trace (what it was trained on),
files and metrics. Loading checks every file parses and expects exactly
those features. Optional, written by training since selections exist:
"point" = {"baselines": {ewma_halflife_s, period_steps}, "selection": the
per-horizon, per-class choice with every candidate's validation MAE
(selection.py)}, with the level-free boosters as files.l1 (l1_h1.txt, ...)
when trained. Without "point" the served point forecast is the count
booster's mean, as before. Optional, written since burst classifiers exist
(burst_choice.py): "burst" = the per-horizon source of the served burst
probability and both sources' validation scores, with the classifiers as
files.burst (burst_h1.txt, ...); without it the burst probability is the
count distribution's, as before. Optional, written by save_model
(fitting/lgbm_save.py) since compiled
trees exist: "compiled", every booster as a shared library beside its file
(count_h1.so, ...; compiled_trees.py). Loaded last and checked against the
boosters; when absent or unusable the model serves LightGBM's predict, the
same outputs, and `inference` (GetModelInfo) says which path serves and why.

Serving: the expected count served is exactly the bundle's (the chosen
candidate or blend per horizon and family class, lgbm_bundle.py), the
choice readable through `choices` (GetModelInfo), the burst probability's
source per horizon through `burst_choices`. Features come from the core's OnlineFeatures (state.features), as of
the last complete step. Families never seen read as a fresh family (all
family features zero, cluster and time terms current), so their forecast is
the model's own prior for a newcomer. A requested horizon the model was not
trained for uses the nearest trained one at or above it (else the longest),
its expected and upper counts scaled by h / h_trained; its burst probability
is taken as is.

Ranking (the core's top-k, see models.py): every row's expected count at
the first asked horizon comes from that horizon's booster alone, scored once
per distinct feature row (a booster scores each row alone, so equal rows get
equal bits) and kept per row for as long as the features stay the same (one
step); the other boosters and the count distribution run only for the rows
kept.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import lightgbm as lgb
import numpy as np

from speckv.services.common.errors import InvalidArgument
from speckv.services.predictor.serving import compiled_trees
from speckv.services.predictor.serving.booster_text import checked_model_text
from speckv.services.predictor.serving.burst_choice import BURST_KIND, BurstChoice, HorizonBurstChoice
from speckv.services.predictor.serving.count_models import (
    BURST_DEFINITION,
    HISTORY_HALFLIVES,
    CountForecast,
    SeriesState,
)
from speckv.services.predictor.serving.feature_baselines import FeatureBaselines, season_lags
from speckv.services.predictor.serving.feature_spec import FeatureSpec
from speckv.services.predictor.serving.features import OnlineFeatures
from speckv.services.predictor.serving.level_free import extra_columns
from speckv.services.predictor.serving.lgbm_bundle import KINDS, LEVEL_FREE_KIND, LevelOffset, LgbmBundle
from speckv.services.predictor.serving.selection import Choice, Selection

EXTRA_KEYS = ("features", "feature_spec", "alarm_threshold", "dispersion", "offset", "trace", "files")
OPTIONAL_KEYS = ("point", "compiled", "burst")


class LightGbmModel:
    name = "lightgbm"
    # Threads of a forecast of PARALLEL_MIN_ROWS rows or more (the row halves, lgbm_forecaster.py)
    threads = 2

    def __init__(self, bundle: LgbmBundle, version: str, metrics: Mapping[str, float] | None = None,
                 trace: str = "", inference: str = "") -> None:
        self.bundle = bundle
        self.version = version
        self.horizons_s = bundle.horizons_s
        self.quantile = bundle.quantile
        self.features = bundle.spec.names()
        self.metrics = dict(metrics or {})
        self.trace = trace
        # How the trees are evaluated, for GetModelInfo: the compiled trees, or LightGBM's predict and why
        self.inference = inference or (bundle.compiled.describe() if bundle.compiled is not None
                                       else "lightgbm predict (the model was not loaded from a model directory)")
        s = bundle.spec
        self.burst_definition = (f"{BURST_DEFINITION} Here burst_ratio={s.burst_ratio:g}, "
                                 f"min_burst_count={s.min_burst_count:g}, long_halflife_s={s.long_halflife_s:g} "
                                 "(discrete exposure-corrected EWMA of the features).")

    @property
    def feature_spec(self) -> FeatureSpec:
        return self.bundle.spec

    @property
    def choices(self) -> tuple[Choice, ...]:
        """The served point forecast per horizon and family class (empty: the mean)."""
        selection = self.bundle.selection
        return selection.choices if selection is not None else ()

    @property
    def burst_choices(self) -> tuple[HorizonBurstChoice, ...]:
        """The burst probability's source per horizon, as the manifest's
        "burst" and "alarm_threshold" record it (empty: no classifiers, the
        count distribution serves every horizon)."""
        bundle = self.bundle
        if bundle.burst is None or BURST_KIND not in bundle.boosters:
            return ()
        return bundle.burst.per_horizon(self.horizons_s, bundle.alarm_threshold)

    @property
    def family_classes(self) -> str:
        """How a row's family class is decided (empty without a selection)."""
        selection = self.bundle.selection
        if selection is None:
            return ""
        return selection.classes.describe(f"level_hl{self.bundle.spec.long_halflife_s:g}s")

    @property
    def history_s(self) -> float:
        s = self.bundle.spec
        return max(s.ring * s.step_s, HISTORY_HALFLIVES * max((*s.halflives_s, s.long_halflife_s)))

    def forecast(self, state: SeriesState, now_s: float, horizons: np.ndarray) -> CountForecast:
        return self.forecast_features(_online(state).features(state.rows), horizons)

    def rank(self, state: SeriesState, now_s: float, horizons: np.ndarray) -> "LgbmRanking":
        """Every row's expected count at the first horizon from that
        horizon's booster alone; features and scores kept per row in
        state.memos while the features stay the same (they change once per
        step, the scheduler asks four times a step, at two horizons); the
        other boosters and the distribution only for the rows selected."""
        online = _online(state)
        col, scale = self._columns(horizons)
        first = int(col[0])
        memos = state.memos
        if memos is None or (state.rows < 0).any():  # a family not tracked has no row to keep a value for
            features = online.features
            values = self._expected_at(features(state.rows), first)
        else:
            def features(rows: np.ndarray) -> np.ndarray:
                return memos.slot((self.name, "features")).fetch(state.features_version, rows, online.features)

            values = memos.slot((self.name, first)).fetch(
                state.features_version, state.rows, lambda rows: self._expected_at(features(rows), first))
        return LgbmRanking(self, state.rows, features, horizons, values * scale[0, 0])

    def _expected_at(self, X: np.ndarray, i: int) -> np.ndarray:
        """bundle.expected_at(X, i), each distinct row scored once: rows with
        the same features (families whose histories match step for step)
        score the same bits, a booster scoring each row alone."""
        distinct, inverse = _distinct_rows(X)
        return self.bundle.expected_at(distinct, i, self.threads)[inverse]

    def _columns(self, horizons: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The trained horizon serving each asked one, and the scale to it (1, asked)."""
        trained = np.asarray(self.horizons_s)
        asked = np.asarray(horizons, dtype=np.float64)
        col = np.minimum(np.searchsorted(trained, asked - 1e-9), len(trained) - 1)
        return col, (asked / trained[col])[None, :]

    def forecast_features(self, X: np.ndarray, horizons: np.ndarray) -> CountForecast:
        """The forecast of rows with features X (one row each)."""
        expected, upper, prob = self.bundle.predict(X, self.threads)
        col, scale = self._columns(horizons)
        return CountForecast(expected[:, col] * scale, upper[:, col] * scale, prob[:, col])


class LgbmRanking:
    """LightGbmModel's Ranking: select() runs the whole forecast on the
    selected rows' features (each row's features and scores depend on that
    row alone, so they equal the full forecast's rows)."""

    def __init__(self, model: LightGbmModel, rows: np.ndarray, features: Callable[[np.ndarray], np.ndarray],
                 horizons: np.ndarray, key: np.ndarray) -> None:
        self._model, self._rows, self._features, self._horizons = model, rows, features, horizons
        self.key = key

    def select(self, index: np.ndarray) -> CountForecast:
        return self._model.forecast_features(self._features(self._rows[index]), self._horizons)


def _distinct_rows(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows of X, index of each row of X among them), rows
    compared byte for byte."""
    X = np.ascontiguousarray(X)
    keys = X.view(np.dtype((np.void, X.dtype.itemsize * X.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return X[first], inverse.ravel()


def _online(state: SeriesState) -> OnlineFeatures:
    if state.features is None:
        raise InvalidArgument("the lightgbm model needs the core's online features")
    return state.features


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
    if "point" in manifest:
        _parse_point(manifest["point"], files, directory, bundle)
    if "burst" in manifest:
        _parse_burst(manifest["burst"], files, directory, bundle)
    # Last, once every booster parsed: the compiled trees are checked against them. Any problem with
    # them is a fallback to LightGBM's predict (same outputs), never a refused model.
    bundle.compiled, why = compiled_trees.load(manifest.get("compiled"), directory,
                                               {kind: files[kind] for kind in bundle.boosters}, bundle.boosters)
    inference = f"lightgbm predict (fallback: {why})" if bundle.compiled is None else ""
    return LightGbmModel(bundle, version, metrics, str(manifest["trace"]), inference)


def _parse_point(value: Any, files: Any, directory: Path, bundle: LgbmBundle) -> None:
    """Sets bundle.baselines, the level-free boosters and bundle.selection
    from the manifest's "point"; InvalidArgument naming the key otherwise."""
    if not isinstance(value, dict) or sorted(value) != ["baselines", "selection"]:
        raise InvalidArgument("point: must be an object with exactly baselines and selection")
    raw = value["baselines"]
    if not isinstance(raw, dict) or sorted(raw) != ["ewma_halflife_s", "period_steps"]:
        raise InvalidArgument("point.baselines: must be an object with exactly ewma_halflife_s and period_steps")
    halflife, period = raw["ewma_halflife_s"], raw["period_steps"]
    if isinstance(halflife, bool) or not isinstance(halflife, (int, float)) or not np.isfinite(halflife) \
            or halflife <= 0 or isinstance(period, bool) or not isinstance(period, int) or period < 0:
        raise InvalidArgument("point.baselines: ewma_halflife_s must be a number > 0, period_steps an integer >= 0")
    baselines = FeatureBaselines(bundle.spec, float(halflife), period)
    try:
        baselines.validate()
    except ValueError as exc:
        raise InvalidArgument(f"point.baselines: {exc}") from None
    read = season_lags(period, bundle.steps()) if period > 0 else ()
    missing = [lag for lag in read if lag not in bundle.spec.lags]
    if missing:
        raise InvalidArgument(f"point.baselines.period_steps={period}: reads lag_{missing[0]}, not a feature")
    bundle.baselines = baselines
    names = files.get(LEVEL_FREE_KIND) if isinstance(files, dict) else None
    if names is not None:
        if not isinstance(names, list) or len(names) != len(bundle.horizons_s):
            raise InvalidArgument(f"files.{LEVEL_FREE_KIND}: must list one model file per horizon")
        extra = extra_columns(baselines)  # the level-free features' own columns
        bundle.boosters[LEVEL_FREE_KIND] = [_booster(directory, name, len(bundle.spec.names()) + extra,
                                                     f"files.{LEVEL_FREE_KIND}") for name in names]
    try:
        bundle.selection = Selection.from_dict(value["selection"], bundle.horizons_s, bundle.candidate_names())
    except ValueError as exc:
        raise InvalidArgument(f"point.{exc}" if str(exc).startswith("selection") else f"point.selection: {exc}") \
            from None


def _parse_burst(value: Any, files: Any, directory: Path, bundle: LgbmBundle) -> None:
    """Sets the burst classifiers and bundle.burst from the manifest's
    "burst" and files.burst; InvalidArgument naming the key otherwise."""
    try:
        choice = BurstChoice.from_dict(value, len(bundle.horizons_s))
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    names = files.get(BURST_KIND) if isinstance(files, dict) else None
    if not isinstance(names, list) or len(names) != len(bundle.horizons_s):
        raise InvalidArgument(f"files.{BURST_KIND}: must list one model file per horizon")
    bundle.boosters[BURST_KIND] = [_booster(directory, name, len(bundle.spec.names()), f"files.{BURST_KIND}")
                                   for name in names]
    bundle.burst = choice


def _booster(directory: Path, name: Any, num_features: int, key: str) -> lgb.Booster:
    """The booster file `name` of the model directory, read once and checked.
    Errors name the file as the manifest does (relative to the directory),
    never by the server's path: ReloadModel returns them to its caller."""
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        raise InvalidArgument(f"{key}: {name!r} is not a file name in the model directory")
    path = directory / name
    if not path.is_file():
        raise InvalidArgument(f"{key}: {name!r} does not exist in the model directory")
    if not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory)):
        # a symlink out of the directory would read a file the model root does not hold
        raise InvalidArgument(f"{key}: {name!r} leads outside the model directory (a symlink); refused")
    try:
        # Read once and checked (booster_text.py): LightGBM loads what was checked, never the file again
        text = checked_model_text(path.read_bytes(), num_features)
    except ValueError as exc:
        raise InvalidArgument(f"{key}: {name!r} is not a served LightGBM model ({exc})") from None
    try:
        booster = lgb.Booster(model_str=text)
    except (lgb.basic.LightGBMError, ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{key}: {name!r} is not a LightGBM model ({exc})") from None
    if booster.num_feature() != num_features:
        raise InvalidArgument(f"{key}: {name!r} expects {booster.num_feature()} features, the spec gives {num_features}")
    return booster
