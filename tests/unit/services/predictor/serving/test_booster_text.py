"""booster_text.py: a served booster's trees are checked before LightGBM
loads them, so a node no probe row walks cannot kill or wedge the server
(found by `speckv bench predictor --crafted`: a split_feature of 2**31-1
deep in one tree, SIGSEGV at a later Forecast)."""
from __future__ import annotations

import random
import re

import lightgbm as lgb
import numpy as np
import pytest

from speckv.loadgen.bench.predictor.damage import edit_node
from speckv.services.predictor.serving.booster_text import checked_model_text
from speckv.services.predictor.serving.feature_spec import FeatureSpec

FEATURES = 6


@pytest.fixture(scope="module")
def model_text() -> str:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, FEATURES))
    y = X[:, 0] * 2 + X[:, 1] + rng.normal(size=400) * 0.1
    booster = lgb.train({"objective": "regression", "num_leaves": 7, "verbose": -1},
                        lgb.Dataset(X, y), num_boost_round=5)
    return booster.model_to_string()


def test_a_good_booster_loads_the_same(model_text: str) -> None:
    text = checked_model_text(model_text.encode(), FEATURES)
    assert "tree_sizes=" not in text
    X = np.random.default_rng(1).normal(size=(50, FEATURES))
    assert np.array_equal(lgb.Booster(model_str=text).predict(X), lgb.Booster(model_str=model_text).predict(X))


@pytest.mark.parametrize("key, value, message", [
    ("left_child", "1000000", "outside the tree"),
    ("right_child", str(-(2**31)), "outside the tree"),
    ("left_child", "0", "reached twice"),  # back to the root: a walk would loop
    ("split_feature", str(2**31 - 1), "split_feature"),
    ("split_feature", "-1", "split_feature"),
    ("split_feature", str(FEATURES), "split_feature"),  # max_feature_idx + 1: one past the last feature
    ("threshold", "nan", "NaN"),
    ("leaf_value", "inf", "not finite"),
    ("decision_type", "1", "decision_type"),  # categorical
    ("decision_type", "12", "decision_type"),  # missing type 3 (bits 2-3): LightGBM writes 0, 1 or 2
])
def test_a_bad_node_anywhere_is_refused(model_text: str, key: str, value: str, message: str) -> None:
    for seed in range(5):  # any tree, any node: not only the ones a probe row would walk
        text, where = edit_node(model_text, random.Random(seed), key, lambda _l, _j: value)
        with pytest.raises(ValueError, match=message):
            checked_model_text(text.encode(), FEATURES)


@pytest.mark.parametrize("key, value", [
    ("split_feature", str(FEATURES - 1)),  # max_feature_idx: the last feature
    ("split_feature", "0"),
    ("decision_type", "8"),  # missing type 2 (NaN), the largest LightGBM writes
    ("decision_type", "10"),  # missing type 2 with default-left
])
def test_a_node_at_each_bound_is_accepted(model_text: str, key: str, value: str) -> None:
    """The other side of each refusal above: a boundary moved by one fails here or there."""
    for seed in range(5):
        text, _where = edit_node(model_text, random.Random(seed), key, lambda _l, _j: value)
        lgb.Booster(model_str=checked_model_text(text.encode(), FEATURES))


@pytest.mark.parametrize("edit", [
    lambda t: re.sub(r"num_leaves=\d+", "num_leaves=100000", t, count=1),
    lambda t: re.sub(r"num_leaves=\d+", "num_leaves=0", t, count=1),
    lambda t: t.replace("num_tree_per_iteration=1", "num_tree_per_iteration=2"),
    lambda t: t.replace(f"max_feature_idx={FEATURES - 1}", "max_feature_idx=1000"),
    lambda t: t.replace("Tree=1\n", "Tree=1\nnum_leaves=3\n", 1),  # a key twice
    lambda t: t[: len(t) // 2],
    lambda t: "\xff" + t,
])
def test_malformed_text_is_refused(model_text: str, edit) -> None:
    with pytest.raises(ValueError):
        checked_model_text(edit(model_text).encode("utf-8"), FEATURES)


@pytest.mark.parametrize("key, value", [("turn_cap", []), ("turn_cap", "64"), ("lags", [1.5]), ("lags", 3),
                                        ("time_of_day", 1), ("burst_span", 2.5), ("halflives_s", [None])])
def test_a_wrongly_typed_feature_spec_is_refused(key: str, value: object) -> None:
    """turn_cap = [] passed validate() and failed every Forecast in the
    server (INTERNAL; found by `speckv bench predictor --crafted`)."""
    with pytest.raises(ValueError, match=key):
        FeatureSpec.from_dict({key: value})
