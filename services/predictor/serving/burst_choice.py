"""The served burst probability's source per horizon (issue 22, item 2):
BurstChoice, as the manifest's "burst" records it, and the classifiers'
probability transform. How the classifiers are trained and the source
chosen on validation: fitting/burst_model.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

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
