"""One LightGBM booster trained with early stopping and cut to its best
iteration, as every booster the predictor serves is trained (the count,
level-free and burst boosters alike).

Invariants of `train_early_stopped`'s booster: with a validation set and
stop > 0, training ends after `stop` rounds without gain on it and the
booster holds exactly the trees up to the best iteration (so the served,
saved and compiled trees are those the validation chose); otherwise it holds
all `rounds` trees.
"""
from __future__ import annotations

from typing import Any, Mapping

import lightgbm as lgb


def train_early_stopped(params: Mapping[str, Any], data: lgb.Dataset, rounds: int,
                        validation: lgb.Dataset | None, stop: int) -> lgb.Booster:
    stopping = validation is not None and stop > 0
    booster = lgb.train(dict(params), data, num_boost_round=rounds,
                        valid_sets=[validation] if stopping else [],
                        callbacks=[lgb.early_stopping(stop, verbose=False)] if stopping else [])
    if booster.best_iteration > 0:
        booster = lgb.Booster(model_str=booster.model_to_string(num_iteration=booster.best_iteration))
    return booster
