"""Planted arrival streams and the small LightGBM model trained on them:
steady Poisson families plus one family with planted periodic bursts
(seeded, so every run is the same). The crafted-model bench
(predictor/crafted.py) derives its damaged directories from this model;
the predictor tests use the same helpers (tests/support/predictor_synthetic.py
re-exports them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from speckv.services.predictor.fitting.family_counts import FamilyCounts, aggregate
from speckv.services.predictor.fitting.lgbm_save import save_model
from speckv.services.predictor.fitting.training import load_config, train_on_counts
from speckv.services.predictor.serving.lgbm_served import LightGbmModel

BURST_PERIOD_S = 45.0
BURST_SIZE = 25
BURST_SPREAD_S = 2.0
PLANTED_MODEL_S = 1200.0  # seconds of planted counts the model trains on (quick rounds: a few seconds)


def planted_arrivals(duration_s: float, seed: int = 0, start_s: float = 0.0) -> tuple[np.ndarray, list[str]]:
    """(times, families) sorted by time: 'bursty' at 0.3/s plus BURST_SIZE
    arrivals within BURST_SPREAD_S every BURST_PERIOD_S; 'steady-a' at 1/s,
    'steady-b' at 0.2/s."""
    rng = np.random.default_rng(seed)
    times: list[np.ndarray] = []
    names: list[str] = []
    for name, rate in (("bursty", 0.3), ("steady-a", 1.0), ("steady-b", 0.2)):
        t = rng.uniform(0, duration_s, rng.poisson(rate * duration_s))
        times.append(t)
        names += [name] * len(t)
    for begin in np.arange(BURST_PERIOD_S - 7.0, duration_s - BURST_SPREAD_S, BURST_PERIOD_S):
        times.append(begin + rng.uniform(0, BURST_SPREAD_S, BURST_SIZE))
        names += ["bursty"] * BURST_SIZE
    all_times = np.concatenate(times) + start_s
    order = np.argsort(all_times, kind="stable")
    return all_times[order], [names[i] for i in order]


def planted_counts(duration_s: float, seed: int = 0) -> FamilyCounts:
    times, names = planted_arrivals(duration_s, seed)
    return aggregate(times, names, 1.0, 0.0, duration_s)


def save_planted_model(directory: Path, seed: int = 1, version: str = "lgbm-v1") -> Path:
    """A LightGBM model trained on planted counts (quick rounds), saved in
    directory with its compiled trees where this host can build them."""
    result = train_on_counts(planted_counts(PLANTED_MODEL_S, seed=seed), load_config(quick=True))
    save_model(directory, LightGbmModel(result.bundle, version, trace="planted"))
    return directory
