"""LightGBM models: planted bursts flagged ahead of time, seeded reproducibility,
model directories through load_model, and the online retrainer's validation."""
from __future__ import annotations

import json

import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import InvalidArgument
from speckv.services.predictor.fitting.dataset import build_rows
from speckv.services.predictor.fitting.family_counts import FamilyCounts
from speckv.services.predictor.fitting.lgbm_save import save_model
from speckv.services.predictor.fitting.retrain import Retrainer, RetrainOutcome, RetrainSettings
from speckv.services.predictor.fitting.training import load_config, train_on_counts
from speckv.services.predictor.judging.evaluation import burst_score
from speckv.services.predictor.serving import compiled_trees
from speckv.services.predictor.serving.core import PredictorCore, PredictorSettings
from speckv.services.predictor.serving.count_models import EwmaModel, EwmaParams
from speckv.services.predictor.serving.lgbm_served import LightGbmModel
from speckv.services.predictor.serving.manifest import load_model
from speckv.services.predictor.serving.observations import Arrival
from tests.support.predictor_synthetic import planted_arrivals, planted_counts

DURATION_S = 2400.0
H5 = 2  # index of the 5 s horizon


@pytest.fixture(scope="module")
def config():
    return load_config(quick=True)


@pytest.fixture(scope="module")
def trained(config):
    data = planted_counts(DURATION_S)
    split = int(0.7 * data.steps)
    train = FamilyCounts(data.families, data.counts[:, :split].tocsr(), data.step_s, data.start_s)
    return data, split, train_on_counts(train, config)


def test_planted_periodic_bursts_are_flagged_ahead_of_time(config, trained):
    data, split, result = trained
    test = build_rows(data, result.bundle.spec, config.horizons_s, config.track_s)
    test = test.take(np.flatnonzero(test.step >= split))
    _, _, prob = result.bundle.predict(test.X)
    score = burst_score(test.label[:, H5], prob[:, H5] >= result.bundle.alarm_threshold[H5], test.onset[:, H5],
                        test.family, test.step, 1.0)
    assert score.episodes >= 10  # a planted burst every 45 s over 720 s
    assert score.recall >= 0.8 and score.precision >= 0.7
    assert score.lead_time_s >= 2.0  # seen coming, not noticed on arrival


def test_training_is_reproducible(config, trained):
    data, split, result = trained
    train = FamilyCounts(data.families, data.counts[:, :split].tocsr(), data.step_s, data.start_s)
    again = train_on_counts(train, config)
    for kind, boosters in result.bundle.boosters.items():
        for a, b in zip(boosters, again.bundle.boosters[kind]):
            assert a.model_to_string() == b.model_to_string()


def test_saved_model_loads_through_the_manifest_and_predicts_the_same(trained, tmp_path):
    _, _, result = trained
    model = LightGbmModel(result.bundle, "t-1", {"mae_5s": 1.0}, trace="planted")
    save_model(tmp_path / "m", model)
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["kind"] == "lightgbm" and manifest["features"] == list(result.bundle.spec.names())
    assert sorted(p.name for p in (tmp_path / "m").glob("*.txt")) == sorted(
        f"{kind}_h{h:g}.txt" for kind in ("count", "l1", "burst") for h in result.bundle.horizons_s)
    assert manifest["point"]["selection"] == result.bundle.selection.to_dict()
    assert len(manifest["dispersion"]) == len(result.bundle.horizons_s) and manifest["offset"]["prior_per_step"] > 0
    loaded = load_model(tmp_path / "m")
    assert isinstance(loaded, LightGbmModel) and loaded.version == "t-1" and loaded.trace == "planted"
    assert loaded.bundle.compiled is not None or compiled_trees.unavailable()  # served by the compiled trees
    assert loaded.choices == result.bundle.selection.choices
    X = result.rows.X[:500]
    for a, b in zip(result.bundle.predict(X), loaded.bundle.predict(X)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("edit, key", [
    (lambda m: m.update(features=m["features"][:-1]), "features"),
    (lambda m: m.update(alarm_threshold=[0.5]), "alarm_threshold"),
    (lambda m: m["files"]["count"].__setitem__(0, "../x.txt"), "files.count"),
    (lambda m: m["files"]["count"].__setitem__(1, "absent.txt"), "files.count"),
    (lambda m: m.update(dispersion=[0.1, -1.0, 0.1, 0.1]), "dispersion"),
    (lambda m: m["offset"].update(halflife_s=7.0), "offset.halflife_s"),
    (lambda m: m["offset"].pop("prior_steps"), "offset"),
    (lambda m: m.pop("feature_spec"), "feature_spec"),
    (lambda m: m.update(quantile=2.0), "quantile"),
    (lambda m: m["point"]["selection"]["choices"][0].update(weights={"no-such": 1.0}), "point.selection"),
    (lambda m: m["point"]["selection"]["choices"][0].update(weights={"ewma": 0.5}), "point.selection"),
    (lambda m: m["point"]["selection"]["choices"].pop(), "point.selection.choices"),
    (lambda m: m["point"]["baselines"].update(period_steps=-1), "point.baselines"),
    (lambda m: m["point"]["baselines"].update(period_steps=400), "point.baselines.period_steps"),
    (lambda m: m["files"]["l1"].pop(), "files.l1"),
])
def test_broken_model_directories_are_invalid(trained, tmp_path, edit, key):
    _, _, result = trained
    save_model(tmp_path, LightGbmModel(result.bundle, "t-1"), compile_trees=False)  # the manifest is under test
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    edit(manifest)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidArgument, match=key):
        load_model(tmp_path)


def test_garbage_booster_file_is_invalid(trained, tmp_path):
    _, _, result = trained
    save_model(tmp_path, LightGbmModel(result.bundle, "t-1"), compile_trees=False)
    (tmp_path / "count_h2.txt").write_text("not a model")
    with pytest.raises(InvalidArgument, match="files.count"):
        load_model(tmp_path)


def _fed_core(duration_s: float) -> PredictorCore:
    times, names = planted_arrivals(duration_s, seed=5, start_s=1000.0)
    core = PredictorCore(ManualClock(1000.0 + duration_s), EwmaModel(EwmaParams(version="ewma-0")),
                         PredictorSettings(window_s=900.0))
    core.observe(Arrival(float(t), n) for t, n in zip(times, names))
    return core


def test_retrainer_swaps_in_a_validated_model_and_keeps_the_old_one_otherwise(config, tmp_path):
    core = _fed_core(900.0)
    strict = Retrainer(core, config, RetrainSettings(tmp_path, tolerance=-0.999))  # nothing can pass
    rejected = strict.retrain_once()
    assert rejected.outcome is RetrainOutcome.REJECTED and "validation MAE" in rejected.reason
    assert core.model_info().version == "ewma-0"

    retrainer = Retrainer(core, config, RetrainSettings(tmp_path))
    result = retrainer.retrain_once()
    assert result.outcome is RetrainOutcome.SWAPPED, result.reason
    info = core.model_info()
    assert info.name == "lightgbm" and info.version == result.version
    assert info.source == str(tmp_path / result.version)
    forecast = core.forecast(["bursty", "steady-a", "never-seen"])
    assert forecast.model_version == result.version and forecast.known.tolist() == [True, True, False]
    assert np.isfinite(forecast.expected).all() and (forecast.expected >= 0).all()
    assert forecast.expected[1, 0] > forecast.expected[2, 0] * 0.5  # a 1/s family is not read as idle


def test_retrainer_skips_without_history_and_survives_a_failing_train(config, tmp_path):
    core = PredictorCore(ManualClock(0.0), EwmaModel(EwmaParams()), PredictorSettings())
    assert Retrainer(core, config, RetrainSettings(tmp_path)).retrain_once().outcome is RetrainOutcome.SKIPPED
    core = _fed_core(600.0)
    broken = load_config(quick=True)
    broken = type(broken)(**{**{f: getattr(broken, f) for f in broken.__dataclass_fields__},
                             "lightgbm": {**broken.lightgbm, "count": {"objective": "no-such-objective"}}})
    result = Retrainer(core, broken, RetrainSettings(tmp_path)).retrain_once()
    assert result.outcome is RetrainOutcome.FAILED and core.model_info().name == "ewma"
