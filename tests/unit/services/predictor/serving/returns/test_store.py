"""A saved return model predicts exactly what it did before it was saved;
a malformed directory is a client error naming what is wrong, never a crash.
Past turns for warming a tracker round-trip too."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.predictor.fitting.returns.dataset import build_rows
from speckv.services.predictor.fitting.returns.training import MIN_TRAINING_TURNS, train_before
from speckv.services.predictor.fitting.returns.turns import build_turns
from speckv.services.predictor.serving.returns.store import (
    PastTurn,
    load_return_model,
    read_past_turns,
    save_return_model,
    write_past_turns,
)
from speckv.services.predictor.serving.returns.tracker import ReturnTracker
from tests.support.returns_model import CONFIG, VERSION, save_synthetic_model, synthetic_model
from tests.support.returns_conversations import conversations


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_synthetic_model(tmp_path_factory.mktemp("returns") / "model")


@pytest.fixture(scope="module")
def rows():
    return build_rows(build_turns(conversations(200, 3600.0, seed=9)), CONFIG.features)


def test_a_loaded_model_predicts_bit_for_bit_what_the_saved_one_did(saved, rows):
    model, loaded = synthetic_model(), load_return_model(saved)
    assert loaded.version == VERSION and loaded.spec == CONFIG.features and loaded.source == str(saved)
    assert loaded.model.horizons_s == model.horizons_s and loaded.model.feature_names == model.feature_names
    assert loaded.model.tail == model.tail and loaded.model.tail.offsets_s
    for a, b in zip(model.fits, loaded.model.fits):
        assert (a.horizon_s, a.train_rows, a.validation_rows, a.trees) == (b.horizon_s, b.train_rows,
                                                                           b.validation_rows, b.trees)
        assert a.base_rate == b.base_rate
    assert np.array_equal(model.predict_raw(rows.X), loaded.model.predict_raw(rows.X))
    assert np.array_equal(model.predict_cdf(rows.X), loaded.model.predict_cdf(rows.X))


def test_a_horizon_without_a_booster_keeps_its_base_rate_and_nan_survives_as_null(tmp_path, rows):
    model = synthetic_model()
    stripped = type(model)(model.horizons_s, model.feature_names, [None, *model.boosters[1:]],
                           [type(model.fits[0])(30.0, 0, 0, float("nan"), 0, float("nan")), *model.fits[1:]],
                           model.tail)
    directory = save_return_model(tmp_path / "m", stripped, CONFIG.features)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["boosters"][0] is None and manifest["fits"][0]["base_rate"] is None
    assert manifest["version"].startswith("returns-")  # derived from the content
    loaded = load_return_model(directory).model
    assert np.array_equal(stripped.predict_cdf(rows.X), loaded.predict_cdf(rows.X))
    assert (loaded.predict_raw(rows.X)[:, 0] == 0.0).all()  # NaN base rate: no rows, predicts 0


def test_the_tracker_serves_a_loaded_model_exactly_as_the_saved_one(saved):
    requests = conversations(60, 1200.0, seed=4)
    trackers = [ReturnTracker(m, CONFIG.features) for m in (synthetic_model(), load_return_model(saved).model)]
    for tracker in trackers:
        for r in requests:
            tracker.arrival(r.family, r.arrival_s, r.prompt_tokens)
            tracker.turn_end(r.family, r.arrival_s + 5.0, r.arrival_s, r.prompt_tokens, r.output_tokens)
    a, b = (t.p_within(1300.0, 120.0) for t in trackers)
    assert a[0] == b[0] and len(a[0]) > 10 and np.array_equal(a[1], b[1])


def _copy(saved, tmp_path):
    return shutil.copytree(saved, tmp_path / "copy")


def _edit(directory, **changes):
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest.update(changes)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


@pytest.mark.parametrize("edit, message", [
    ({"kind": "lightgbm"}, "kind="),
    ({"format": 3}, "format="),
    ({"format": 1}, "recalibration: not a key of format 1"),
    ({"recalibration": {"enabled": True}}, "recalibration"),
    ({"recalibration": {"enabled": True, "window_s": -1, "prior_rows": 0, "max_shift_logit": 1}}, "window_s"),
    ({"extra_key": 1}, "extra_key: unknown key"),
    ({"version": 3}, "version="),
    ({"horizons_s": [30, 60]}, "feature_spec.horizons_s"),
    ({"feature_names": ["a"]}, "feature_names"),
    ({"boosters": ["../escape.txt", None, None, None, None]}, "boosters[0]"),
    ({"boosters": ["missing.txt", None, None, None, None]}, "does not exist"),
    ({"boosters": [None]}, "one file name"),
    ({"fits": []}, "fits"),
    ({"tail": {"offsets_s": [60, 30], "ratio": [0.9, 0.8]}}, "tail"),
    ({"feature_spec": {"horizons_s": [30]}}, "feature_spec"),
])
def test_a_malformed_manifest_is_invalid_argument_naming_the_key(saved, tmp_path, edit, message):
    directory = _edit(_copy(saved, tmp_path), **edit)
    with pytest.raises(InvalidArgument, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_return_model(directory)


def test_a_booster_file_that_is_not_a_model_or_reads_other_features_is_invalid_argument(saved, tmp_path):
    directory = _copy(saved, tmp_path)
    name = json.loads((directory / "manifest.json").read_text())["boosters"][1]
    (directory / name).write_text("not a model")
    with pytest.raises(InvalidArgument, match="not a LightGBM model"):
        load_return_model(directory)
    text = (saved / name).read_text().replace("turn_index", "other_name")
    (directory / name).write_text(text)
    with pytest.raises(InvalidArgument, match="reads features"):
        load_return_model(directory)


def test_no_model_there_is_failed_precondition_and_bad_json_invalid_argument(tmp_path):
    with pytest.raises(FailedPrecondition):
        load_return_model(tmp_path / "absent")
    with pytest.raises(FailedPrecondition):
        load_return_model(tmp_path)  # a directory without a manifest
    with pytest.raises(InvalidArgument):
        load_return_model("")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        load_return_model(tmp_path)


def test_past_turns_round_trip_and_a_bad_line_is_named(tmp_path):
    turns = [PastTurn("c1", 10.0, 17.5, 1200, 40), PastTurn("c2", 11.25, None, 300, 0)]
    path = write_past_turns(tmp_path / "warm.jsonl", turns)
    assert read_past_turns(path) == turns
    good = path.read_text().splitlines()[0]
    for bad in ('{"conversation": "", "arrival_s": 1, "end_s": null, "prompt_tokens": 1, "output_tokens": 1}',
                '{"conversation": "c", "arrival_s": 5, "end_s": 4, "prompt_tokens": 1, "output_tokens": 1}',
                '{"conversation": "c", "arrival_s": 5, "end_s": null, "prompt_tokens": -1, "output_tokens": 1}',
                '{"conversation": "c"}', "[1, 2"):
        path.write_text(good + "\n" + bad + "\n")
        with pytest.raises(InvalidArgument, match="warm.jsonl:2"):
            read_past_turns(path)
    with pytest.raises(FailedPrecondition):
        read_past_turns(tmp_path / "absent.jsonl")


def test_training_on_a_compressed_clock_is_the_trace_time_model_read_on_that_clock():
    """At speed 2 every time is halved, horizons and windows too: the 15 s
    horizon is the trace's 30 s one, trained on the same rows, to the same
    trees, and a row's probabilities are the same read on either clock."""
    requests = conversations(400, 3600.0, seed=2)
    normal, fast = train_before(requests, 3000.0, CONFIG), train_before(requests, 3000.0, CONFIG, speed=2.0)
    assert normal.until_s == 3000.0 and fast.until_s == 1500.0 and normal.turns == fast.turns
    assert fast.model.extra["until_s"] == 1500.0 and normal.spec == CONFIG.features
    assert fast.spec.horizons_s == tuple(h / 2 for h in CONFIG.horizons_s) == fast.model.horizons_s
    assert fast.spec.rate_windows_s == tuple(w / 2 for w in CONFIG.features.rate_windows_s)
    for a, b in zip(normal.model.fits, fast.model.fits):
        assert (a.train_rows, a.validation_rows, a.base_rate, a.trees) == (b.train_rows, b.validation_rows,
                                                                           b.base_rate, b.trees)
    assert fast.model.tail.ratio == normal.model.tail.ratio
    assert fast.model.tail.offsets_s == tuple(o / 2 for o in normal.model.tail.offsets_s)
    rows = build_rows(build_turns(requests, CONFIG.service), CONFIG.features)
    halved = build_rows(build_turns([dataclasses.replace(r, arrival_s=r.arrival_s / 2) for r in requests],
                                    lambda p, o: CONFIG.service(p, o) / 2), fast.spec)
    assert np.array_equal(normal.model.predict_cdf(rows.X), fast.model.predict_cdf(halved.X))
    assert train_before(requests[:MIN_TRAINING_TURNS - 1], 3600.0, CONFIG) is None
