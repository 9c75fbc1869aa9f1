"""Burst classifiers (burst_model.py): chosen per horizon on validation,
alarms with lead where a precursor exists, the manifest form, and a saved
model that serves the same bits compiled or not."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.predictor.fitting.burst_model import choose_sources
from speckv.services.predictor.fitting.dataset import Rows, build_rows
from speckv.services.predictor.fitting.family_counts import FamilyCounts, aggregate
from speckv.services.predictor.fitting.lgbm_save import save_model
from speckv.services.predictor.fitting.training import load_config, train_on_counts
from speckv.services.predictor.judging.evaluation import burst_score
from speckv.services.predictor.serving.burst_choice import BURST_KIND, CLASSIFIER, DISTRIBUTION, BurstChoice
from speckv.services.predictor.serving.lgbm_served import LightGbmModel
from speckv.services.predictor.serving.manifest import load_model

DURATION_S = 2400.0
H5 = 2  # index of the 5 s horizon


def _precursor_counts(seed: int, leaders: int = 6) -> FamilyCounts:
    """'follower' bursts (40 arrivals in 2 s) at random times (35-70 s
    apart, so the time since the last burst says little), each announced
    3-6 s ahead by a stir: each of `leaders` quiet families sends one
    request. The follower's own history says nothing: lead can only come
    from the families rising together and the cluster's slope. 'steady' is
    Poisson noise."""
    rng = np.random.default_rng(seed)
    times, names = [], []
    for name, rate in [("follower", 0.2), ("steady", 0.5)] + [(f"leader-{i}", 0.02) for i in range(leaders)]:
        t = rng.uniform(0, DURATION_S, rng.poisson(rate * DURATION_S))
        times += t.tolist()
        names += [name] * len(t)
    start = 30.0
    while start < DURATION_S - 20:
        times += (start + rng.uniform(0, 3, leaders)).tolist()
        names += [f"leader-{i}" for i in range(leaders)]
        times += (start + 6 + rng.uniform(0, 2, 40)).tolist()
        names += ["follower"] * 40
        start += rng.uniform(35, 70)
    order = np.argsort(times, kind="stable")
    return aggregate(np.array(times)[order], [names[i] for i in order], 1.0, 0.0, DURATION_S)


def _train(config):
    data = _precursor_counts(5)
    split = int(0.7 * data.steps)
    train = FamilyCounts(data.families, data.counts[:, :split].tocsr(), data.step_s, data.start_s)
    return config, data, split, train_on_counts(train, config).bundle


@pytest.fixture(scope="module")
def trained():
    config = load_config(quick=True)  # the trend features are opt-in (services/config/predictor.json)
    return _train(dataclasses.replace(config, spec=dataclasses.replace(config.spec, trend_spans=(5,))))


def _held_out_score(config, data, split, bundle):
    test = build_rows(data, bundle.spec, config.horizons_s, config.track_s)
    test = test.take(np.flatnonzero(test.step >= split))
    _, _, prob = bundle.predict(test.X)
    return burst_score(test.label[:, H5], prob[:, H5] >= bundle.alarm_threshold[H5], test.onset[:, H5],
                       test.family, test.step, 1.0)


def test_a_burst_announced_by_other_families_rising_together_is_alarmed_before_it_lands(trained):
    config, _, _, bundle = trained
    assert bundle.burst is not None and len(bundle.boosters[BURST_KIND]) == len(config.horizons_s)
    score = _held_out_score(*trained)
    assert score.episodes >= 10
    assert score.recall >= 0.8 and score.precision >= 0.8
    assert score.lead_time_s >= 3.0 and score.early >= 0.8


def test_without_the_trend_features_the_same_bursts_are_mostly_seen_late():
    plain = _train(load_config(quick=True))
    assert plain[0].spec.trend_spans == ()
    score = _held_out_score(*plain)
    assert score.early <= 0.6  # what the trend features add in the test above


def _rows(label: np.ndarray) -> Rows:
    n = len(label)
    z = np.zeros((n, 1), np.float32)
    return Rows(z, z, z, label[:, None], np.ones((n, 1), np.int16), np.zeros(n, np.int32),
                np.arange(n, dtype=np.int32))


@pytest.mark.parametrize("classifier_hits,expected", [(3, CLASSIFIER), (2, DISTRIBUTION), (1, DISTRIBUTION)])
def test_the_source_with_the_higher_validation_f1_serves_ties_to_the_distribution(classifier_hits, expected):
    label = np.zeros(40, bool)
    starts = (5, 15, 25)
    for s in starts:
        label[s:s + 2] = True
    distribution = np.zeros(40)
    distribution[[5, 15]] = 0.9  # two of three bursts
    classifier = np.zeros(40)
    classifier[list(starts[:classifier_hits])] = 0.9
    choice, thresholds = choose_sources(_rows(label), {DISTRIBUTION: distribution[:, None],
                                                       CLASSIFIER: classifier[:, None]}, 1.0)
    assert choice.sources == (expected,) and choice.episodes == (3,)
    assert thresholds[0] == choice.scores[0][expected]["threshold"]


def test_a_choice_survives_its_manifest_form_and_a_malformed_one_is_refused():
    choice = BurstChoice((CLASSIFIER, DISTRIBUTION), ({}, {DISTRIBUTION: {"f1": 0.5, "precision": None,
                                                                         "recall": 1.0, "lead_s": 2.0,
                                                                         "threshold": 0.3}}), (4, 0))
    assert BurstChoice.from_dict(json.loads(json.dumps(choice.to_dict())), 2) == choice
    for bad in ({**choice.to_dict(), "sources": ["oracle", DISTRIBUTION]}, {**choice.to_dict(), "episodes": [1]},
                {**choice.to_dict(), "extra": 1}, [], {**choice.to_dict(), "scores": [{}, {CLASSIFIER: 1}]}):
        with pytest.raises(ValueError, match="burst"):
            BurstChoice.from_dict(bad, 2)


def test_a_saved_model_serves_the_classifier_bits_compiled_or_not(trained, tmp_path):
    _, data, split, trained_bundle = trained
    n = len(trained_bundle.horizons_s)  # the classifier at every horizon, whatever validation chose: the path tested
    bundle = dataclasses.replace(trained_bundle, burst=BurstChoice((CLASSIFIER,) * n, ({},) * n, (0,) * n))
    save_model(tmp_path / "m", LightGbmModel(bundle, "burst-v1", trace="precursor"))
    loaded = load_model(tmp_path / "m")
    assert isinstance(loaded, LightGbmModel) and loaded.bundle.compiled is not None
    assert loaded.bundle.burst == bundle.burst
    X = build_rows(data, bundle.spec, (1.0, 2.0, 5.0, 10.0), 300.0).X[-3000:]
    served = loaded.bundle.predict(X)
    fallback = dataclasses.replace(loaded.bundle, compiled=None).predict(X)
    for a, b, c in zip(served, fallback, bundle.predict(X)):
        assert a.tobytes() == b.tobytes() == c.tobytes()
    assert not np.array_equal(served[2], trained_bundle.predict(X)[2])  # the classifier's, not the distribution's


@pytest.mark.parametrize("edit", ["burst", "files"])
def test_a_malformed_burst_entry_is_invalid_argument(trained, tmp_path, edit):
    _, _, _, bundle = trained
    path = save_model(tmp_path / "m", LightGbmModel(bundle, "burst-v1", trace="precursor"), compile_trees=False)
    manifest = json.loads(path.read_text())
    if edit == "burst":
        manifest["burst"]["sources"] = ["oracle"] * len(manifest["burst"]["sources"])
    else:
        del manifest["files"][BURST_KIND]
    path.write_text(json.dumps(manifest))
    with pytest.raises(InvalidArgument, match="burst"):
        load_model(tmp_path / "m")


def test_per_horizon_is_the_recorded_choice_with_nan_for_undefined_scores():
    """What GetModelInfo shows per horizon: the recorded source, the served
    alarm threshold, the episodes and each scored source's figures (null:
    NaN), in SOURCES order."""
    scores = {DISTRIBUTION: {"f1": None, "precision": None, "recall": 0.0, "lead_s": None, "threshold": 0.5},
              CLASSIFIER: {"f1": 0.5, "precision": 0.4, "recall": 2 / 3, "lead_s": 1.0, "threshold": 0.25}}
    choice = BurstChoice((CLASSIFIER, DISTRIBUTION), (scores, {}), (3, 0))
    first, second = choice.per_horizon((1.0, 5.0), (0.25, 0.5))
    assert (first.horizon_s, first.chosen, first.alarm_threshold, first.episodes) == (1.0, CLASSIFIER, 0.25, 3)
    assert [s.source for s in first.scores] == [CLASSIFIER, DISTRIBUTION]
    assert (first.scores[0].f1, first.scores[0].recall, first.scores[0].threshold) == (0.5, 2 / 3, 0.25)
    assert math.isnan(first.scores[1].f1) and math.isnan(first.scores[1].lead_s) and first.scores[1].recall == 0.0
    assert (second.chosen, second.episodes, second.scores) == (DISTRIBUTION, 0, ())
