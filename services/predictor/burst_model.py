"""Burst probability from a classifier of the burst label (issue 22, item 2).

The count booster's negative binomial gives P(count > threshold) as a side
effect of a model of the mean: its shape is fixed, so a ramp that the trees
see (trend.py's slopes, the families rising together) moves the burst
probability only as far as it moves the mean. Here one binary booster per
horizon ("burst" boosters, objective binary) learns the burst label of
BURST_DEFINITION itself (targets.py: count over h > max(burst_ratio * level *
h, min_burst_count)) from the same features, and its probability is
sigmoid(raw score), exactly what LightGBM's binary predict returns.

Which probability is served, per horizon, is chosen on the validation slice
of training (the newest part; never a reported row): the classifier when its
event F1 at its own best alarm threshold (evaluation.best_alarm_threshold)
is higher than the count distribution's at its own, else the count
distribution (ties to it: the older source, and no bursts in validation
means no evidence). The choice, both sources' validation scores and the
served alarm threshold are recorded in the manifest ("burst",
"alarm_threshold") and shown by GetModelInfo's burst_choices (one
HorizonBurstChoice per horizon, BurstChoice.per_horizon). Training rows and weights are the count booster's
(idle rows sampled at keep_zero, weight 1 / keep_zero: a row with no
arrivals is never a burst, so the sampling keeps the labels' expectation).

Config: `burst` in services/config/predictor.json: num_boost_round,
early_stopping_rounds (on the validation slice's binary log loss) and the
LightGBM params; empty or absent: no classifier, the count distribution.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import lightgbm as lgb
import numpy as np

from speckv.services.predictor.dataset import Rows
from speckv.services.predictor.early_stopped import train_early_stopped
from speckv.services.predictor.evaluation import best_alarm_threshold, burst_score

if TYPE_CHECKING:
    from speckv.services.predictor.lgbm_forecaster import LgbmBundle

BURST_KIND = "burst"  # boosters["burst"]: the classifiers, when trained
CLASSIFIER, DISTRIBUTION = "classifier", "count-distribution"
SOURCES = (CLASSIFIER, DISTRIBUTION)
SCORE_KEYS = ("f1", "precision", "recall", "lead_s", "threshold")  # a source's validation scores, SourceScore's order


def probability(raw: np.ndarray) -> np.ndarray:
    """sigmoid(raw), float64: LightGBM's binary objective's output transform."""
    return 1.0 / (1.0 + np.exp(-np.asarray(raw, dtype=np.float64)))


@dataclass(frozen=True, slots=True)
class BurstChoice:
    """The served burst probability's source per horizon and what chose it.

    Invariants: one source per horizon, each in SOURCES; scores[i] maps each
    source that was scored at horizon i to its validation event scores
    (f1, precision, recall, lead_s, threshold); episodes[i] >= 0."""

    sources: tuple[str, ...]
    scores: tuple[Mapping[str, Mapping[str, float | None]], ...]
    episodes: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"sources": list(self.sources), "scores": [dict(s) for s in self.scores],
                "episodes": list(self.episodes)}

    @classmethod
    def from_dict(cls, value: Any, horizons: int) -> "BurstChoice":
        """ValueError naming the key when value is not a choice for `horizons` horizons."""
        if not isinstance(value, dict) or sorted(value) != ["episodes", "scores", "sources"]:
            raise ValueError("burst: must be an object with exactly episodes, scores and sources")
        sources, scores, episodes = value["sources"], value["scores"], value["episodes"]
        for key, items in (("sources", sources), ("scores", scores), ("episodes", episodes)):
            if not isinstance(items, list) or len(items) != horizons:
                raise ValueError(f"burst.{key}: must list one entry per horizon")
        if any(s not in SOURCES for s in sources):
            raise ValueError(f"burst.sources: each must be one of {', '.join(SOURCES)}")
        if any(isinstance(e, bool) or not isinstance(e, int) or e < 0 for e in episodes):
            raise ValueError("burst.episodes: each must be an integer >= 0")
        for per in scores:
            if not isinstance(per, dict) or any(k not in SOURCES or not _scores_ok(v) for k, v in per.items()):
                raise ValueError("burst.scores: each must map a source to its validation scores")
        return cls(tuple(sources), tuple(scores), tuple(episodes))

    def per_horizon(self, horizons_s: Sequence[float], alarm_threshold: Sequence[float]) \
            -> tuple["HorizonBurstChoice", ...]:
        """The choice as GetModelInfo shows it: per horizon, the source served,
        the served alarm threshold and each scored source's validation scores
        (None read as NaN), sources in SOURCES order."""
        out = []
        for i, h in enumerate(horizons_s):
            scored = []
            for name in SOURCES:
                raw = self.scores[i].get(name)
                if raw is not None:
                    scored.append(SourceScore(name, *(math.nan if raw[k] is None else float(raw[k])
                                                      for k in SCORE_KEYS)))
            out.append(HorizonBurstChoice(float(h), self.sources[i], float(alarm_threshold[i]), self.episodes[i],
                                          tuple(scored)))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class SourceScore:
    """One source's validation event scores at its own best alarm
    threshold (evaluation.burst_score); NaN where undefined."""

    source: str
    f1: float
    precision: float
    recall: float
    lead_s: float  # median over detected episodes, seconds from the first alarm to the burst
    threshold: float


@dataclass(frozen=True, slots=True)
class HorizonBurstChoice:
    """What serves the burst probability at one horizon. Invariants: chosen
    in SOURCES; alarm_threshold in [0, 1] (the manifest's, for this
    horizon); episodes >= 0, the validation slice's burst episodes."""

    horizon_s: float
    chosen: str
    alarm_threshold: float
    episodes: int
    scores: tuple[SourceScore, ...]


def _scores_ok(value: Any) -> bool:
    return isinstance(value, dict) and sorted(value) == sorted(SCORE_KEYS) and all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
        for v in value.values())


def train_burst(train: Rows, valid: Rows, index: np.ndarray, weight: np.ndarray, config: Mapping[str, Any],
                base_params: Mapping[str, Any], seed: int) -> list[lgb.Booster]:
    """One binary booster per horizon on the rows index (weights weight) of
    train; early stopping on valid's log loss when it holds both labels."""
    params = {**base_params, **dict(config.get("params", {})), "objective": "binary", "seed": seed}
    rounds, stop = int(config.get("num_boost_round", 100)), int(config.get("early_stopping_rounds", 0))
    X = np.ascontiguousarray(train.X[index])
    boosters: list[lgb.Booster] = []
    for i in range(train.label.shape[1]):
        data = lgb.Dataset(X, label=train.label[index, i].astype(np.float64), weight=weight, free_raw_data=False,
                           params={"max_bin": int(base_params.get("max_bin", 63)), "feature_pre_filter": False,
                                   "verbosity": -1})
        labels = valid.label[:, i] if len(valid) else np.zeros(0, bool)
        validation = (lgb.Dataset(valid.X, label=labels.astype(np.float64), reference=data, free_raw_data=False)
                      if stop > 0 and labels.any() and not labels.all() else None)
        boosters.append(train_early_stopped(params, data, rounds, validation, stop))
    return boosters


def fit_burst(bundle: "LgbmBundle", train: Rows, valid: Rows, config: Mapping[str, Any],
              lightgbm: Mapping[str, Any]) -> None:
    """Trains the classifiers into bundle.boosters[BURST_KIND] and sets
    bundle.burst and bundle.alarm_threshold from the validation slice.
    lightgbm: the count booster's seed, keep_zero, num_threads, max_bin."""
    from speckv.services.predictor.lgbm_forecaster import BASE_PARAMS, TRAIN_THREADS, sample_weights

    if not config or not len(valid):
        return
    seed = int(lightgbm.get("seed", 0))
    index, weight = sample_weights(train, float(lightgbm.get("keep_zero", 1.0)), seed)
    base_params = {**BASE_PARAMS, "num_threads": int(lightgbm.get("num_threads", TRAIN_THREADS)),
                   "max_bin": int(lightgbm.get("max_bin", 63))}
    bundle.boosters[BURST_KIND] = train_burst(train, valid, index, weight, config, base_params, seed)
    bundle.burst = None  # the distribution's probability first, then the classifier's, on the same rows
    _, _, distribution = bundle.predict(valid.X)
    bundle.burst = BurstChoice((CLASSIFIER,) * len(bundle.horizons_s), ({},) * len(bundle.horizons_s),
                               (0,) * len(bundle.horizons_s))
    _, _, classifier = bundle.predict(valid.X)
    bundle.burst, bundle.alarm_threshold = choose_sources(
        valid, {DISTRIBUTION: distribution, CLASSIFIER: classifier}, bundle.spec.step_s)


def choose_sources(valid: Rows, probs: Mapping[str, np.ndarray], step_s: float) -> tuple[BurstChoice, list[float]]:
    """Per horizon, the source with the higher validation event F1 at its own
    best alarm threshold (ties: DISTRIBUTION), and that threshold.
    probs: source -> (N, horizons) probabilities on valid's rows."""
    sources, scores, episodes, thresholds = [], [], [], []
    for i in range(valid.label.shape[1]):
        per: dict[str, dict[str, float | None]] = {}
        for name in (DISTRIBUTION, CLASSIFIER):
            if name not in probs:
                continue
            p = probs[name][:, i]
            t = best_alarm_threshold(p, valid.label[:, i], valid.onset[:, i], valid.family, valid.step, step_s)
            s = burst_score(valid.label[:, i], p >= t, valid.onset[:, i], valid.family, valid.step, step_s)
            per[name] = {"f1": _num(s.f1), "precision": _num(s.precision), "recall": _num(s.recall),
                         "lead_s": _num(s.lead_time_s), "threshold": t}
        best = max(per, key=lambda n: (per[n]["f1"] or 0.0, n == DISTRIBUTION))
        sources.append(best)
        scores.append(per)
        thresholds.append(float(per[best]["threshold"] or 0.5))
        episodes.append(int(burst_score(valid.label[:, i], np.zeros(len(valid), bool), valid.onset[:, i],
                                        valid.family, valid.step, step_s).episodes))
    return BurstChoice(tuple(sources), tuple(scores), tuple(episodes)), thresholds


def _num(value: float) -> float | None:
    return None if math.isnan(value) else float(value)
