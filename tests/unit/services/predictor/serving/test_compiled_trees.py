"""Compiled trees (issue 22, item 4): every booster kind a model has, compiled
by treelite + tl2cgen, scores bit for bit what LightGBM's predict scores, on
random rows, on rows straddling every threshold (NaN, zeros and LightGBM's
zero threshold included) and on real feature rows; the served forecast is
the same with and without them; a missing, corrupt, foreign or unbuildable
artefact falls back to LightGBM's predict and says so; a library that
crashes is a refused reload (the probe process dies, not the predictor)."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import FailedPrecondition
from speckv.services.predictor.fitting.lgbm_save import save_model
from speckv.services.predictor.fitting.training import TrainResult, load_config, train_on_counts
from speckv.services.predictor.serving import compiled_trees
from speckv.services.predictor.serving.burst_choice import BURST_KIND
from speckv.services.predictor.serving.compiled_trees import CompiledBooster, Unsupported, check_rows, thresholds
from speckv.services.predictor.serving.core import PredictorCore, PredictorSettings
from speckv.services.predictor.serving.count_models import EwmaModel, EwmaParams
from speckv.services.predictor.serving.level_free import LevelFreeRows, level_free_features
from speckv.services.predictor.serving.lgbm_bundle import LEVEL_FREE_KIND, PARALLEL_MIN_ROWS, LgbmBundle
from speckv.services.predictor.serving.lgbm_served import LightGbmModel
from speckv.services.predictor.serving.manifest import MANIFEST_NAME, load_model
from speckv.services.predictor.serving.model_reload import reload_model
from speckv.services.predictor.serving.sandbox import probe_model
from tests.support.predictor_synthetic import planted_counts


def test_compiled_trees_are_available_wherever_the_project_installs():
    """treelite and tl2cgen are pinned dependencies and gcc is part of the set-up:
    a machine where they fail is broken, not excused (the fallback has its own tests below)."""
    assert compiled_trees.unavailable() == ""

FALLBACK = "lightgbm predict (fallback: "


@pytest.fixture(scope="module")
def trained() -> TrainResult:
    """A quick model with a selection: count, level-free (l1) and burst classifier boosters."""
    result = train_on_counts(planted_counts(1200.0, seed=1), load_config(quick=True))
    assert sorted(result.bundle.boosters) == [BURST_KIND, "count", LEVEL_FREE_KIND]
    return result


@pytest.fixture(scope="module")
def saved(trained: TrainResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model written once, compiled trees and all; tests tamper with copies."""
    directory = tmp_path_factory.mktemp("compiled") / "m"
    save_model(directory, LightGbmModel(trained.bundle, "c-1"))
    return directory


def copy_of(saved: Path, target: Path) -> Path:
    shutil.copytree(saved, target)
    return target


def manifest_of(directory: Path) -> dict:
    return json.loads((directory / MANIFEST_NAME).read_text())


def rewrite_manifest(directory: Path, edit) -> None:
    manifest = manifest_of(directory)
    edit(manifest)
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


def bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float64).view(np.int64)


def assert_same_bits(a, b) -> None:
    if isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            assert_same_bits(x, y)
        return
    assert a.shape == b.shape
    np.testing.assert_array_equal(bits(a), bits(b))


def rows_for(bundle: LgbmBundle, kind: str, k: int, X: np.ndarray) -> np.ndarray:
    """What booster kind reads for feature rows X at k steps."""
    if kind in ("count", BURST_KIND):  # both read the feature rows as they are
        return X
    assert bundle.baselines is not None
    return level_free_features(X, bundle.spec, bundle.offset.base(X, bundle.spec), bundle.baselines, k)


# --- bit for bit, every booster kind ---------------------------------------------------------------

def test_every_compiled_booster_scores_lightgbms_bits_on_random_and_straddling_rows(trained, saved):
    model = load_model(saved)
    assert isinstance(model, LightGbmModel) and model.bundle.compiled is not None
    assert model.inference.startswith("compiled trees (tl2cgen")
    bundle, rng = model.bundle, np.random.default_rng(7)
    real = np.ascontiguousarray(trained.rows.X[rng.choice(len(trained.rows), 3000, replace=False)])
    for kind, boosters in bundle.boosters.items():
        for i, (booster, k) in enumerate(zip(boosters, bundle.steps())):
            n = booster.num_feature()
            random_rows = rng.gamma(1.0, 3.0, size=(2000, n)).astype(np.float32)
            random_rows[rng.random(random_rows.shape) < 0.2] = 0.0
            for X in (random_rows, check_rows(thresholds(booster), 2000, seed=i + 1), rows_for(bundle, kind, k, real)):
                assert_same_bits(bundle.compiled.raw(kind, i, X), booster.predict(X, raw_score=True))
            if kind == LEVEL_FREE_KIND:  # the l1 objective has no output transform: raw is what predict served
                assert_same_bits(booster.predict(random_rows, raw_score=True), booster.predict(random_rows))


def test_the_served_forecast_is_the_same_with_and_without_compiled_trees(trained, saved):
    compiled = load_model(saved)
    assert isinstance(compiled, LightGbmModel) and compiled.bundle.compiled is not None
    plain = dataclasses.replace(compiled.bundle, compiled=None)
    X = trained.rows.X[:PARALLEL_MIN_ROWS + 501]  # both the one-thread path and the row halves
    for rows in (X[:1], X[:700], X):
        assert_same_bits(compiled.bundle.predict(rows), plain.predict(rows))
        assert_same_bits(compiled.bundle.predict(rows, num_threads=1), plain.predict(rows, num_threads=1))
        for i in range(len(plain.horizons_s)):
            assert_same_bits(compiled.bundle.expected_at(rows, i), plain.expected_at(rows, i))
    assert_same_bits(trained.bundle.predict(X), compiled.bundle.predict(X))  # the in-memory model trained


def test_level_free_rows_equal_the_features_for_every_horizon(trained):
    bundle, X = trained.bundle, trained.rows.X[:999]
    base = bundle.offset.base(X, bundle.spec)
    shared = LevelFreeRows(X, bundle.spec, base, bundle.baselines)
    for k in reversed(bundle.steps()):
        assert_same_bits(shared.at(k).astype(np.float64),
                         level_free_features(X, bundle.spec, base, bundle.baselines, k).astype(np.float64))


# --- LightGBM's semantics where they are special ------------------------------------------------------

def _booster(X: np.ndarray, y: np.ndarray, **params) -> lgb.Booster:
    data = lgb.Dataset(X, y, params={"verbosity": -1, "min_data_in_bin": 1}, **params.pop("dataset", {}))
    return lgb.train({"objective": "regression", "verbosity": -1, "num_leaves": 7, "min_data_in_leaf": 5,
                      "seed": 1, **params}, data, num_boost_round=15)


def _compiled(booster: lgb.Booster, tmp_path: Path) -> CompiledBooster:
    compiled_trees._compile(booster, tmp_path / "b.so")
    return CompiledBooster.load(tmp_path / "b.so", booster)


def test_nan_as_missing_and_values_lightgbm_reads_as_zero_take_lightgbms_branches(tmp_path):
    rng = np.random.default_rng(3)
    X = rng.choice(np.array([-2.0, -1.0, -1e-36, 0.0, 1e-36, 1.0, 2.0, np.nan]), size=(600, 3)).astype(np.float32)
    y = (np.nan_to_num(X[:, 0], nan=5.0) * 3.0 + (X[:, 1] < 0) * 2.0 + np.isnan(X[:, 2]).astype(float)
         - (X[:, 2] == 0).astype(float))
    booster = _booster(X, y)
    missing_types = {n.get("missing_type") for t in booster.dump_model()["tree_info"]
                     for n in _nodes(t["tree_structure"])}
    assert "NaN" in missing_types  # NaN went to a learned side somewhere
    compiled = _compiled(booster, tmp_path)
    for rows in (X, check_rows(thresholds(booster), 4000)):
        assert_same_bits(compiled.raw(rows), booster.predict(rows, raw_score=True))


def test_a_threshold_at_minus_lightgbms_zero_threshold_zeroes_tiny_inputs_first(tmp_path):
    rng = np.random.default_rng(4)
    X = rng.choice(np.array([-3.0, -1.0, 0.0, 1.0, 3.0]), size=(800, 2)).astype(np.float32)
    y = (X[:, 0] < 0).astype(float) * 4.0 + X[:, 1]
    booster = _booster(X, y)
    cuts = thresholds(booster)
    assert any(((t >= -compiled_trees.ZERO_THRESHOLD) & (t < compiled_trees.ZERO_THRESHOLD)).any() for t in cuts)
    compiled = _compiled(booster, tmp_path)
    tiny = np.array([[-1e-38, 0.5], [-compiled_trees.ZERO_THRESHOLD, -0.5], [-0.0, 1e-38]], dtype=np.float32)
    for rows in (tiny, check_rows(cuts, 4000)):
        assert_same_bits(compiled.raw(rows), booster.predict(rows, raw_score=True))


@pytest.mark.parametrize("params, why", [
    ({"zero_as_missing": True}, "missing type"),
    ({"linear_tree": True}, "linear trees"),
    ({"dataset": {"categorical_feature": [0]}}, "categorical"),
])
def test_what_the_compiled_path_cannot_carry_is_refused(params, why):
    rng = np.random.default_rng(5)
    X = rng.integers(0, 4, size=(500, 2)).astype(np.float32)
    X[::3, 1] = 0.0
    booster = _booster(X, X[:, 0] * 2.0 + (X[:, 1] == 0).astype(float), **params)
    with pytest.raises(Unsupported, match=why):
        compiled_trees.tree_model(booster)


def _nodes(node: dict):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if "left_child" in n:
            stack += [n["left_child"], n["right_child"]]


# --- fallbacks ------------------------------------------------------------------------------------------

def _truncate(d: Path) -> None:
    library = d / "count_h1.so"
    library.write_bytes(library.read_bytes()[:1000])


def _garbage_with_its_hash(d: Path) -> None:
    (d / "l1_h2.so").write_bytes(b"\x7fELF not really a library" * 40)
    rewrite_manifest(d, lambda m: m["compiled"]["sha256"].update({"l1_h2.so": compiled_trees._sha256(d / "l1_h2.so")}))


def _booster_rewritten(d: Path) -> None:
    (d / "count_h2.txt").write_text((d / "count_h2.txt").read_text() + "\n")  # LightGBM reads the same model


def _outside(d: Path) -> None:
    rewrite_manifest(d, lambda m: m["compiled"]["files"]["count"].__setitem__(0, "../count_h1.so"))


@pytest.mark.parametrize("tamper, reason", [
    (lambda d: (d / "count_h5.so").unlink(), "count_h5.so: missing"),
    (_truncate, "count_h1.so: SHA-256 differs"),
    (_garbage_with_its_hash, "did not load"),
    (_booster_rewritten, "compiled from another count_h2.txt"),
    (_outside, "is not a library file name"),
    (lambda d: rewrite_manifest(d, lambda m: m.pop("compiled")), "no compiled trees"),
    (lambda d: rewrite_manifest(d, lambda m: m.update(compiled=[1, 2])), "malformed entry"),
    (lambda d: rewrite_manifest(d, lambda m: m["compiled"].update(library="tl2cgen 0.1, treelite 0.1")),
     "compiled with 'tl2cgen 0.1"),
])
def test_a_missing_or_corrupt_artefact_falls_back_to_lightgbm_with_the_same_forecast(
        trained, saved, tmp_path, tamper, reason):
    reference = load_model(saved)
    directory = copy_of(saved, tmp_path / "m")
    tamper(directory)
    model = load_model(directory)
    assert isinstance(model, LightGbmModel) and model.bundle.compiled is None
    assert model.inference.startswith(FALLBACK) and reason in model.inference
    X = trained.rows.X[:3000]
    assert_same_bits(model.bundle.predict(X), reference.bundle.predict(X))
    core = PredictorCore(ManualClock(0.0), model, PredictorSettings())
    assert core.model_info().inference == model.inference  # what GetModelInfo shows


def test_no_compiler_or_no_library_when_writing_is_recorded_and_served_by_lightgbm(trained, tmp_path, monkeypatch):
    monkeypatch.setattr(compiled_trees, "TOOLCHAIN", "no-such-cc-for-speckv")
    save_model(tmp_path / "a", LightGbmModel(trained.bundle, "c-2"))
    assert manifest_of(tmp_path / "a")["compiled"] == {"unavailable": "no C compiler 'no-such-cc-for-speckv' on PATH"}
    assert not list((tmp_path / "a").glob("*.so"))
    model = load_model(tmp_path / "a")
    assert model.inference == ("lightgbm predict (fallback: not compiled when the model was written: "
                               "no C compiler 'no-such-cc-for-speckv' on PATH)")
    monkeypatch.setattr(compiled_trees, "versions", lambda: "")
    save_model(tmp_path / "b", LightGbmModel(trained.bundle, "c-3"))
    assert "treelite and tl2cgen are not installed" in load_model(tmp_path / "b").inference


def test_a_library_missing_where_the_model_is_loaded_falls_back(saved, monkeypatch):
    monkeypatch.setattr(compiled_trees, "versions", lambda: "")
    model = load_model(saved)
    assert model.inference == "lightgbm predict (fallback: treelite and tl2cgen are not installed)"


def test_save_without_compiling_says_so(trained, tmp_path):
    save_model(tmp_path, LightGbmModel(trained.bundle, "c-4"), compile_trees=False)
    assert "not asked for" in load_model(tmp_path).inference


# --- the reload probe runs the compiled trees --------------------------------------------------------------

def _crashing_library(directory: Path, name: str, at_load: bool) -> None:
    """Replaces directory/name with a library that dies with SIGSEGV when
    loaded (a constructor) or when asked to predict (the rest is the real
    generated code, so it loads and answers tl2cgen's questions first), and
    records its SHA-256 so that nothing but running it can tell. raise(),
    not a null store: gcc may drop a function whose body is undefined."""
    import tl2cgen

    source = directory / "crash-src"
    booster = lgb.Booster(model_file=str(directory / name.replace(".so", ".txt")))
    tl2cgen.generate_c_code(compiled_trees.tree_model(booster), dirpath=str(source), params={})
    main = "#include <signal.h>\n" + (source / "main.c").read_text()
    crash = "  raise(SIGSEGV);\n"
    if at_load:
        main += "\n__attribute__((constructor)) static void speckv_crash(void) {\n" + crash + "}\n"
    else:
        head = "void predict(union Entry* data, int pred_margin, double* result) {\n"
        assert head in main
        main = main.replace(head, head + crash)
    (source / "main.c").write_text(main)
    subprocess.run([compiled_trees.TOOLCHAIN, "-shared", "-fPIC", "-O1", "-std=c99", "-o", str(directory / name),
                    str(source / "main.c"), "-lm"], check=True, capture_output=True)
    shutil.rmtree(source)
    digest = compiled_trees._sha256(directory / name)
    rewrite_manifest(directory, lambda m: m["compiled"]["sha256"].update({name: digest}))


@pytest.mark.parametrize("at_load", [False, True])
def test_a_compiled_library_that_crashes_is_a_refused_reload_and_the_old_model_serves(saved, tmp_path, at_load):
    bad = copy_of(saved, tmp_path / "crash")
    _crashing_library(bad, "count_h2.so", at_load)
    with pytest.raises(FailedPrecondition, match="probe process died.*signal 11"):
        probe_model(bad, timeout_s=60.0)
    clock = ManualClock(100.0)
    good = copy_of(saved, tmp_path / "good")
    core = PredictorCore(clock, EwmaModel(EwmaParams(version="old")), PredictorSettings(model_root=str(tmp_path)))
    with pytest.raises(FailedPrecondition, match="probe process died"):
        reload_model(core, bad.name)
    assert core.model_info().version == "old" and len(core.forecast(["f"]).expected) == 1
    info = reload_model(core, good.name)  # the good directory still reloads, compiled
    assert info.version == "c-1" and info.inference.startswith("compiled trees")
