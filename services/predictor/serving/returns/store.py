"""A session-return model on disk: what `speckv bench returns --save DIR`
and the live e2e bench write and `speckv predictor --returns-model DIR`
serves.

Layout: DIR/manifest.json plus one LightGBM text model per horizon that has
a booster (LightGBM's own `model_to_string` format, which round-trips every
split threshold and leaf value exactly, so a loaded model predicts bit for
bit what the saved one did). The manifest:

    {"kind": "session-returns", "format": 2, "version": "...", "description": "...",
     "horizons_s": [30, ...], "feature_names": [...],
     "feature_spec": {ReturnFeatureSpec fields},
     "boosters": ["h30s.txt" | null, ...],        (null: the horizon's base rate)
     "fits": [{"horizon_s", "train_rows", "validation_rows", "base_rate", "trees", "validation_auc"}, ...],
     "tail": {"offsets_s": [...], "ratio": [...]} | null,
     "train_s": 0.6, "until_s": 2476.0,
     "recalibration": {"enabled", "window_s", "prior_rows", "max_shift_logit"} | null}

NaN (a horizon without rows or validation) is written as null.
"recalibration" (format 2) is how the served tracker shifts the model's
level online (recalibration.py), on the model's clock; null: off. Format 1
(before it existed) is still read and served without recalibration; any
other format is refused naming the formats read. The feature
spec is saved because the online builder must compute exactly the columns
the boosters were trained on.

Errors (never a bare exception): no directory or no manifest ->
FailedPrecondition (nothing to serve there); anything malformed (JSON, an
unknown or missing key, a wrong type, a booster file that is absent, not a
LightGBM model or of the wrong width, names that disagree with the spec) ->
InvalidArgument naming the key; an unreadable file -> FailedPrecondition.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import lightgbm as lgb

from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from speckv.services.predictor.serving.manifest import MANIFEST_NAME, model_directory, read_manifest, write_manifest
from speckv.services.predictor.serving.returns.features import ReturnFeatureSpec
from speckv.services.predictor.serving.returns.model import HorizonFit, ReturnModel
from speckv.services.predictor.serving.returns.recalibration import RecalibrationSpec
from speckv.services.predictor.serving.returns.survival import Tail

KIND = "session-returns"
FORMAT = 2
READS = (1, 2)  # format 1: no "recalibration" key (served without one)
KEYS = ("kind", "format", "version", "description", "horizons_s", "feature_names", "feature_spec", "boosters",
        "fits", "tail", "train_s", "until_s", "recalibration")
REQUIRED = ("kind", "format", "version", "horizons_s", "feature_names", "feature_spec", "boosters", "fits")
FIT_KEYS = ("horizon_s", "train_rows", "validation_rows", "base_rate", "trees", "validation_auc")
SPEC_KEYS = tuple(f.name for f in dataclasses.fields(ReturnFeatureSpec))
MAX_WARM_LINE_CHARS = 4096


@dataclass(frozen=True, slots=True)
class SavedReturnModel:
    """A loaded return model and what serving it needs: the feature spec its
    boosters read, its version (shown in every answer) and where it came from."""

    model: ReturnModel
    spec: ReturnFeatureSpec
    version: str
    description: str
    source: str
    recalibration: RecalibrationSpec = RecalibrationSpec()  # off unless the manifest enables it


def save_return_model(directory: str | Path, model: ReturnModel, spec: ReturnFeatureSpec, version: str = "",
                      description: str = "", recalibration: RecalibrationSpec | None = None) -> Path:
    """Writes the model to directory (created if needed; the manifest last,
    atomically, so a reader never sees a manifest naming missing files).
    version "" derives one from the content. recalibration: how the served
    tracker recalibrates it, on the model's clock (None: off). Returns the
    directory."""
    if tuple(model.feature_names) != spec.names():
        raise InvalidArgument(f"the model's features {model.feature_names} are not the spec's {spec.names()}")
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    names: list[str | None] = []
    texts: list[str] = []
    for horizon, booster in zip(model.horizons_s, model.boosters):
        if booster is None:
            names.append(None)
            continue
        name = f"h{horizon:g}s.txt"
        text = booster.model_to_string()
        (target / name).write_text(text, encoding="utf-8")
        names.append(name)
        texts.append(text)
    manifest: dict[str, Any] = {
        "kind": KIND, "format": FORMAT, "description": description,
        "horizons_s": list(model.horizons_s), "feature_names": list(model.feature_names),
        "feature_spec": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(spec).items()},
        "boosters": names,
        "fits": [{"horizon_s": f.horizon_s, "train_rows": f.train_rows, "validation_rows": f.validation_rows,
                  "base_rate": _finite_or_none(f.base_rate), "trees": f.trees,
                  "validation_auc": _finite_or_none(f.validation_auc)} for f in model.fits],
        "tail": None if model.tail is None else {"offsets_s": list(model.tail.offsets_s),
                                                 "ratio": list(model.tail.ratio)},
        "train_s": float(model.train_s), "until_s": _finite_or_none(float(model.extra.get("until_s", math.nan))),
        "recalibration": None if recalibration is None else recalibration.to_dict(),
    }
    if not version:
        digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode())
        for text in texts:
            digest.update(text.encode())
        version = f"returns-{digest.hexdigest()[:12]}"
    manifest["version"] = version
    write_manifest(target, manifest)
    return target


def load_return_model(path: str | Path) -> SavedReturnModel:
    """Reads and validates the model in path (module docstring: errors)."""
    try:
        directory = model_directory(path)
        manifest = read_manifest(directory)
    except NotFound as exc:
        raise FailedPrecondition(f"no session-return model to serve: {exc}") from None
    unknown = sorted(set(manifest) - set(KEYS))
    if unknown:
        raise InvalidArgument(f"{unknown[0]}: unknown key in {MANIFEST_NAME} (allowed: {', '.join(KEYS)})")
    for key in REQUIRED:
        if key not in manifest:
            raise InvalidArgument(f"{key}: required key missing from {MANIFEST_NAME}")
    if manifest["kind"] != KIND:
        raise InvalidArgument(f"kind={manifest['kind']!r}: a session-return model is kind {KIND!r}")
    fmt = manifest["format"]
    if isinstance(fmt, bool) or fmt not in READS:
        raise InvalidArgument(f"format={fmt!r}: this predictor reads formats {', '.join(map(str, READS))}")
    if fmt == 1 and "recalibration" in manifest:
        raise InvalidArgument("recalibration: not a key of format 1 (format 2 added it)")
    version, description = _string(manifest, "version"), _string(manifest, "description", "")
    if not version:
        raise InvalidArgument("version: must not be empty")
    horizons = tuple(_numbers(manifest["horizons_s"], "horizons_s"))
    names = manifest["feature_names"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidArgument("feature_names: must be a list of strings")
    spec = _spec(manifest["feature_spec"])
    if spec.horizons_s != horizons:
        raise InvalidArgument(f"feature_spec.horizons_s={list(spec.horizons_s)}: not horizons_s={list(horizons)}")
    if tuple(names) != spec.names():
        raise InvalidArgument("feature_names: not the columns feature_spec derives")
    fits = _fits(manifest["fits"], horizons)
    boosters = _boosters(manifest["boosters"], directory, horizons, tuple(names))
    tail = _tail(manifest.get("tail"))
    train_s = manifest.get("train_s", 0.0)
    if not _is_number(train_s):
        raise InvalidArgument(f"train_s={train_s!r}: must be a finite number")
    until = manifest.get("until_s")
    extra: dict[str, Any] = {}
    if until is not None:
        extra["until_s"] = float(_numbers([until], "until_s")[0])
    model = ReturnModel(horizons, tuple(names), boosters, fits, tail, float(train_s), extra)
    return SavedReturnModel(model, spec, version, description, str(directory),
                            _recalibration(manifest.get("recalibration")))


# --- past turns for warming a tracker -------------------------------------------------


@dataclass(frozen=True, slots=True)
class PastTurn:
    """A turn from before the service started, for warming its tracker:
    its conversation, arrival and, if it ended before the history's cut,
    its end (None: still running at the cut). Seconds, the service's clock."""

    conversation: str
    arrival_s: float
    end_s: float | None
    prompt_tokens: int
    output_tokens: int
    follow_ups: int = 0  # requests the caller announced would follow it (TurnEnd.follow_ups)


def write_past_turns(path: str | Path, turns: Sequence[PastTurn]) -> Path:
    """One JSON object a line: conversation, arrival_s, end_s (null: not
    ended), prompt_tokens, output_tokens, and follow_ups where it is not 0."""
    target = Path(path)
    with open(target, "w", encoding="utf-8") as out:
        for t in turns:
            line = {"conversation": t.conversation, "arrival_s": t.arrival_s, "end_s": t.end_s,
                    "prompt_tokens": t.prompt_tokens, "output_tokens": t.output_tokens}
            if t.follow_ups:
                line["follow_ups"] = t.follow_ups
            out.write(json.dumps(line) + "\n")
    return target


def read_past_turns(path: str | Path) -> list[PastTurn]:
    """The file write_past_turns writes; InvalidArgument naming the line for
    a malformed one, FailedPrecondition when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as source:
            return list(_parse_past_turns(source, str(path)))
    except OSError as exc:
        raise FailedPrecondition(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"{path}: not valid UTF-8: {exc}") from None


_PAST_TURN_KEYS = frozenset({"conversation", "arrival_s", "end_s", "prompt_tokens", "output_tokens"})


def _parse_past_turns(lines: Iterator[str], name: str) -> Iterator[PastTurn]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        if len(line) > MAX_WARM_LINE_CHARS:
            raise InvalidArgument(f"{where}: longer than {MAX_WARM_LINE_CHARS} characters")
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"{where}: not valid JSON: {exc}") from None
        if not isinstance(raw, dict) or not _PAST_TURN_KEYS <= set(raw) <= {*_PAST_TURN_KEYS, "follow_ups"}:
            raise InvalidArgument(f"{where}: expected an object with exactly conversation, arrival_s, end_s, "
                                  "prompt_tokens, output_tokens (and optionally follow_ups)")
        conversation, arrival, end = raw["conversation"], raw["arrival_s"], raw["end_s"]
        prompt, output, follow_ups = raw["prompt_tokens"], raw["output_tokens"], raw.get("follow_ups", 0)
        if not isinstance(conversation, str) or not conversation:
            raise InvalidArgument(f"{where}: conversation must be a non-empty string")
        if not (_is_number(arrival) and arrival >= 0) or not (end is None or (_is_number(end) and end >= arrival)):
            raise InvalidArgument(f"{where}: arrival_s must be finite and >= 0, end_s null or >= arrival_s")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (prompt, output, follow_ups)):
            raise InvalidArgument(f"{where}: token counts and follow_ups must be integers >= 0")
        yield PastTurn(conversation, float(arrival), None if end is None else float(end), prompt, output, follow_ups)


# --- validation helpers -----------------------------------------------------------------


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _string(manifest: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = manifest.get(key, default)
    if not isinstance(value, str):
        raise InvalidArgument(f"{key}={value!r}: must be a string")
    return value


def _numbers(value: Any, key: str) -> list[float]:
    if not isinstance(value, list) or not all(_is_number(v) for v in value):
        raise InvalidArgument(f"{key}={value!r}: must be a list of finite numbers")
    return [float(v) for v in value]


def _spec(raw: Any) -> ReturnFeatureSpec:
    if not isinstance(raw, dict) or set(raw) != set(SPEC_KEYS):
        raise InvalidArgument(f"feature_spec: must be an object with exactly {', '.join(SPEC_KEYS)}")
    try:
        for key in ("horizons_s", "rate_windows_s"):
            _numbers(raw[key], f"feature_spec.{key}")
        for key in ("active_window_s", "share_window_s"):
            if not _is_number(raw[key]):
                raise InvalidArgument(f"feature_spec.{key}={raw[key]!r}: must be a finite number")
        for key in ("max_conversations", "turn_cap"):
            if not isinstance(raw[key], int) or isinstance(raw[key], bool):
                raise InvalidArgument(f"feature_spec.{key}={raw[key]!r}: must be an integer")
        if not isinstance(raw["signal_name"], str):
            raise InvalidArgument("feature_spec.signal_name: must be a string")
        return ReturnFeatureSpec(tuple(float(h) for h in raw["horizons_s"]),
                                 tuple(float(w) for w in raw["rate_windows_s"]), float(raw["active_window_s"]),
                                 float(raw["share_window_s"]), raw["max_conversations"], raw["turn_cap"],
                                 raw["signal_name"])
    except ValueError as exc:
        raise InvalidArgument(f"feature_spec: {exc}") from None


def _fits(raw: Any, horizons: tuple[float, ...]) -> list[HorizonFit]:
    if not isinstance(raw, list) or len(raw) != len(horizons):
        raise InvalidArgument(f"fits: must list one object per horizon ({len(horizons)})")
    fits = []
    for i, (fit, horizon) in enumerate(zip(raw, horizons)):
        if not isinstance(fit, dict) or set(fit) != set(FIT_KEYS):
            raise InvalidArgument(f"fits[{i}]: must be an object with exactly {', '.join(FIT_KEYS)}")
        if fit["horizon_s"] != horizon:
            raise InvalidArgument(f"fits[{i}].horizon_s={fit['horizon_s']!r}: not horizons_s[{i}]={horizon:g}")
        counts = [fit[k] for k in ("train_rows", "validation_rows", "trees")]
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise InvalidArgument(f"fits[{i}]: train_rows, validation_rows and trees must be integers >= 0")
        rate, auc = fit["base_rate"], fit["validation_auc"]
        if rate is not None and not (_is_number(rate) and 0.0 <= rate <= 1.0):
            raise InvalidArgument(f"fits[{i}].base_rate={rate!r}: must be null or in [0, 1]")
        if auc is not None and not _is_number(auc):
            raise InvalidArgument(f"fits[{i}].validation_auc={auc!r}: must be null or a finite number")
        fits.append(HorizonFit(horizon, counts[0], counts[1], math.nan if rate is None else float(rate), counts[2],
                               math.nan if auc is None else float(auc)))
    return fits


def _boosters(raw: Any, directory: Path, horizons: tuple[float, ...], names: tuple[str, ...]
              ) -> list[lgb.Booster | None]:
    if not isinstance(raw, list) or len(raw) != len(horizons):
        raise InvalidArgument(f"boosters: must list one file name (or null) per horizon ({len(horizons)})")
    out: list[lgb.Booster | None] = []
    for i, name in enumerate(raw):
        if name is None:
            out.append(None)
            continue
        key = f"boosters[{i}]"
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
            raise InvalidArgument(f"{key}={name!r}: not a file name in the model directory")
        path = directory / name
        try:
            if not path.is_file():
                raise InvalidArgument(f"{key}: {path} does not exist")
            booster = lgb.Booster(model_file=str(path))
        except OSError as exc:
            raise FailedPrecondition(f"{key}: {path} cannot be read ({exc.strerror or exc})") from None
        except (lgb.basic.LightGBMError, ValueError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"{key}: {path} is not a LightGBM model ({exc})") from None
        if booster.num_feature() != len(names) or tuple(booster.feature_name()) != names:
            raise InvalidArgument(f"{key}: {path} reads features {booster.feature_name()}, not feature_names")
        out.append(booster)
    return out


def _recalibration(raw: Any) -> RecalibrationSpec:
    if raw is None:
        return RecalibrationSpec()
    fields = set(RecalibrationSpec().to_dict())
    if not isinstance(raw, dict) or set(raw) != fields:
        raise InvalidArgument(f"recalibration: must be null or an object with exactly {', '.join(sorted(fields))}")
    for key in fields - {"enabled"}:
        if not _is_number(raw[key]):
            raise InvalidArgument(f"recalibration.{key}={raw[key]!r}: must be a finite number")
    try:
        return RecalibrationSpec.from_dict(raw)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def _tail(raw: Any) -> Tail | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"offsets_s", "ratio"}:
        raise InvalidArgument("tail: must be null or an object with exactly offsets_s and ratio")
    try:
        return Tail(tuple(_numbers(raw["offsets_s"], "tail.offsets_s")), tuple(_numbers(raw["ratio"], "tail.ratio")))
    except ValueError as exc:
        raise InvalidArgument(f"tail: {exc}") from None
