"""An experiment behind two settings of services/config/predictor.json
("point": the level-free candidates only, thinning and max_model_weight):
what a level shift between training and serving does to the served point
forecast against last value.

Scripted bursty on/off traffic (the generator of
tests/unit/services/predictor/serving/test_selection.py: silences of mean 20 s,
bursts of mean 8 s at the segment's rate per second, 4 families): trained
on 1,500 s at one level, scored on the 800 s after the features have
followed a shift to another (steps >= 1,600 of 2,400). Prints, per variant,
shift and seed, served MAE / last value's MAE at 1, 2, 5 and 10 s:

- committed: the config as committed;
- no-cap: max_model_weight 1 in every class;
- no-thinning: no thinned training copies;
- all-models: the count booster's mean and median as candidates too.

    PYTHONPATH=. .venv/bin/python docs/scripts/predictor_level_shift.py
"""
import sys
from dataclasses import replace

import numpy as np

from speckv.services.predictor.fitting.dataset import build_rows
from speckv.services.predictor.fitting.training import load_config, train_on_counts
from tests.unit.services.predictor.serving.test_selection import _onoff, _prefix

SHIFTS = ((12.0, 4.0), (3.0, 9.0), (12.0, 12.0))
SEEDS = range(6, 12)


def variants() -> dict:
    config = load_config(quick=True)
    point = dict(config.point)
    selection = dict(point["selection"])
    return {
        "committed": config,
        "no-cap": replace(config, point={**point, "selection": {**selection, "max_model_weight": [1.0, 1.0, 1.0]}}),
        "no-thinning": replace(config, point={**point, "thinning": []}),
        "all-models": replace(config, point={**point, "candidates": ["lightgbm", "lightgbm-median",
                                                                     *point["candidates"]]}),
    }


def ratio(config, before: float, after: float, seed: int) -> np.ndarray:
    data = _onoff([(before, 1500), (after, 900)], seed=seed, families=4)
    bundle = train_on_counts(_prefix(data, 1500), config).bundle
    rows = build_rows(data, bundle.spec, config.horizons_s, config.track_s)
    late = rows.take(np.flatnonzero(rows.step >= 1600))
    truth = late.count.astype(np.float64)
    served = np.mean(np.abs(bundle.expected(late.X) - truth), axis=0)
    last = np.mean(np.abs(late.X[:, [bundle.spec.column("lag_1")]].astype(np.float64)
                          * np.asarray(bundle.steps()) - truth), axis=0)
    return served / last


def main() -> int:
    chosen = sys.argv[1:] or list(variants())
    for name, config in variants().items():
        if name not in chosen:
            continue
        for before, after in SHIFTS:
            ratios = np.array([ratio(config, before, after, seed) for seed in SEEDS])
            print(f"{name:<12} {before:g} -> {after:g}/s: served / last value at 1, 2, 5, 10 s: "
                  f"worst seed {np.round(ratios.max(axis=0), 3).tolist()}, "
                  f"mean {np.round(ratios.mean(axis=0), 3).tolist()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
