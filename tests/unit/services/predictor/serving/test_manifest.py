"""Model directories: strict manifest validation."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from speckv.services.common.errors import InvalidArgument, NotFound
from speckv.services.predictor.serving.count_models import EwmaModel, LastValueModel
from speckv.services.predictor.serving.manifest import MANIFEST_NAME, load_model, write_manifest

GOOD: dict[str, Any] = {"kind": "ewma", "version": "v2", "horizons_s": [1, 5], "quantile": 0.8,
                        "halflife_s": 4.0, "long_halflife_s": 60, "burst_ratio": 2.5, "min_burst_count": 3,
                        "metrics": {"mae_1s": 0.25}}


def model_dir(tmp_path: Path, **changes: Any) -> Path:
    manifest = {**GOOD, **changes}
    manifest = {k: v for k, v in manifest.items() if v is not DROP}
    write_manifest(tmp_path / "model", manifest)
    return tmp_path / "model"


DROP = object()


def test_a_good_ewma_manifest_builds_its_model(tmp_path: Path) -> None:
    model = load_model(model_dir(tmp_path))
    assert isinstance(model, EwmaModel)
    assert (model.version, model.horizons_s, model.quantile) == ("v2", (1.0, 5.0), 0.8)
    assert model.params.halflife_s == 4.0 and model.params.burst_ratio == 2.5
    assert model.metrics == {"mae_1s": 0.25}


def test_a_last_value_manifest_needs_only_the_common_keys(tmp_path: Path) -> None:
    write_manifest(tmp_path / "lv", {"kind": "last-value", "version": "lv1", "horizons_s": [2], "quantile": 0.5})
    model = load_model(str(tmp_path / "lv"))
    assert isinstance(model, LastValueModel) and model.horizons_s == (2.0,) and model.metrics == {}


def test_missing_directory_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        load_model(tmp_path / "absent")


def test_directory_without_manifest_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match=MANIFEST_NAME):
        load_model(tmp_path)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "\xff\xfe"])
def test_unreadable_manifest_is_invalid(tmp_path: Path, text: str) -> None:
    (tmp_path / MANIFEST_NAME).write_text(text, encoding="latin-1")
    with pytest.raises(InvalidArgument, match=MANIFEST_NAME):
        load_model(tmp_path)


@pytest.mark.parametrize("changes, key", [
    ({"kind": "lightgbm-v9"}, "kind"),
    ({"kind": DROP}, "kind"),
    ({"halflife": 3}, "halflife"),  # a typo is an unknown key, not a silent default
    ({"kind": "last-value"}, "halflife_s"),  # not a parameter of last-value
    ({"version": DROP}, "version"),
    ({"version": ""}, "version"),
    ({"version": 3}, "version"),
    ({"horizons_s": []}, "horizons_s"),
    ({"horizons_s": [0, 1]}, "horizons_s"),
    ({"horizons_s": [5, 1]}, "horizons_s"),
    ({"horizons_s": "1,2"}, "horizons_s"),
    ({"quantile": 1.5}, "quantile"),
    ({"quantile": True}, "quantile"),
    ({"halflife_s": -1}, "halflife_s"),
    ({"halflife_s": "10"}, "halflife_s"),
    ({"long_halflife_s": 0}, "long_halflife_s"),
    ({"burst_ratio": 0.5}, "burst_ratio"),
    ({"min_burst_count": -2}, "min_burst_count"),
    ({"metrics": [1]}, "metrics"),
    ({"metrics": {"mae": "low"}}, "metrics.mae"),
])
def test_bad_manifests_name_the_key(tmp_path: Path, changes: dict[str, Any], key: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        load_model(model_dir(tmp_path, **changes))
    assert str(caught.value).startswith(key), str(caught.value)


def test_nan_values_are_refused(tmp_path: Path) -> None:
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({**GOOD, "quantile": float("nan")}))
    with pytest.raises(InvalidArgument, match="quantile"):
        load_model(tmp_path)


def test_empty_path_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="path"):
        load_model("")
