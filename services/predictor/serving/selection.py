"""Which point forecast is served, per horizon and family class: chosen on
the validation slice of training, never on rows a benchmark reports.

Candidates are point forecasts of the count over a horizon, one value per
row: the models ("lightgbm": the count booster's mean, "lightgbm-median":
the median of its negative binomial, "lightgbm-l1": level_free.py) and the
baselines read off the features (feature_baselines.py).

Family class: a row's class is read from its own long-run level
(level_hl<L>s, arrivals per second) against fixed edges, so it is known
causally at serving time and a family that quietens moves to the quieter
class's choice. Classes: names[i] covers edges[i - 1] <= level < edges[i].

Rule, per horizon and class, on the class's validation rows:
1. every candidate's mean absolute error (MAE) over those rows;
2. b = the baseline with the lowest MAE; m = the model with the lowest MAE;
3. the blend w * m + (1 - w) * b for w on the grid 0, 1/n, ..., cap (n =
   blend_steps, cap = the class's max_model_weight) with the lowest MAE
   (ties: the smaller w, the baseline's side);
4. served: that blend when w > 0 and its MAE <= (1 - margin) * MAE(b),
   else b alone. So the served forecast is the best baseline unless a model
   beats it on validation by the margin; it is never a model that lost to a
   baseline there.
Why a cap: a model learns the noise of the levels it was trained at, and
Poisson noise is not scale-free (its relative size falls as the level
rises), so after a level shift a level-free model can lose its edge while
a baseline moves with the data; a share of the best baseline bounds that,
at little cost where nothing shifted (docs/predictor.md). A sparse class
forecasts mostly zeros, which stay right under a shift, so it may have no cap.
A class with fewer than min_rows validation rows takes the choice made over
all of the horizon's rows under its own cap (`inherited`), so a handful of
rows never decides. margin, min_rows, blend_steps, the caps and the edges
are fixed in the config.

Invariant (what the service serves): `combine` applies the recorded
weights row by row (each row's value depends on that row alone, summed in
name order), so a forecast of any subset of rows equals those rows of the
full forecast bit for bit, and the training code scores exactly what the
service serves.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

BLEND = "blend"
ALL_CLASSES = "all"


@dataclass(frozen=True, slots=True)
class FamilyClasses:
    """Classes of rows by long-run level, arrivals per second."""

    edges_per_s: tuple[float, ...]
    names: tuple[str, ...]

    def validate(self) -> None:
        edges = self.edges_per_s
        if len(self.names) != len(edges) + 1:
            raise ValueError(f"classes: {len(self.names)} names for {len(edges)} edges (need edges + 1)")
        if len(set(self.names)) != len(self.names) or ALL_CLASSES in self.names or not all(self.names):
            raise ValueError(f"classes.names={list(self.names)}: must be distinct, non-empty, not {ALL_CLASSES!r}")
        if not all(math.isfinite(e) and e > 0 for e in edges) or list(edges) != sorted(set(edges)):
            raise ValueError(f"classes.edges_per_s={list(edges)}: must be finite, > 0 and strictly increasing")

    def classify(self, level_per_s: np.ndarray) -> np.ndarray:
        """Class index of each row, int64 (N,)."""
        return np.searchsorted(np.asarray(self.edges_per_s), np.asarray(level_per_s, dtype=np.float64),
                               side="right").astype(np.int64)

    def describe(self, level_feature: str) -> str:
        parts, low = [], 0.0
        for name, high in zip(self.names, (*self.edges_per_s, math.inf)):
            parts.append(f"{name}: {low:g} <= {level_feature} < {high:g}")
            low = high
        return f"by the row's long-run level in arrivals/s ({'; '.join(parts)})"


@dataclass(frozen=True, slots=True)
class SelectionRules:
    margin: float = 0.02  # fraction of the best baseline's MAE a model or blend must win by
    min_rows: int = 200  # validation rows below which a class inherits the all-class choice
    blend_steps: int = 10  # the blend weight grid is 0, 1/n, ..., 1
    max_model_weight: tuple[float, ...] = ()  # per class, the model's largest weight; empty: 1 for every class

    def validate(self, classes: int) -> None:
        if not (math.isfinite(self.margin) and 0.0 <= self.margin < 1.0):
            raise ValueError(f"selection.margin={self.margin}: must be in [0, 1)")
        if self.min_rows < 1 or self.blend_steps < 1:
            raise ValueError(f"selection.min_rows={self.min_rows}, blend_steps={self.blend_steps}: must be >= 1")
        caps = self.max_model_weight
        if caps and (len(caps) != classes or not all(0.0 <= c <= 1.0 for c in caps)):
            raise ValueError(f"selection.max_model_weight={list(caps)}: one weight in [0, 1] per class")

    def cap(self, c: int) -> int:
        """The largest grid step j (weight j / blend_steps) the model may take in class c."""
        weight = self.max_model_weight[c] if self.max_model_weight else 1.0
        return int(math.floor(weight * self.blend_steps + 1e-9))


@dataclass(frozen=True, slots=True)
class Choice:
    """The served forecast at one horizon for one class. weights: candidate
    -> weight (> 0, summing to 1), by name; validation_mae: every candidate
    and the blend on this class's validation rows (NaN with no rows)."""

    horizon_s: float
    family_class: str
    chosen: str  # a candidate, or BLEND
    weights: tuple[tuple[str, float], ...]
    validation_mae: tuple[tuple[str, float], ...]
    rows: int
    inherited: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"horizon_s": self.horizon_s, "family_class": self.family_class, "chosen": self.chosen,
                "weights": dict(self.weights), "rows": self.rows, "inherited": self.inherited,
                "validation_mae": {k: (None if math.isnan(v) else v) for k, v in self.validation_mae}}


@dataclass(frozen=True, slots=True)
class Selection:
    """choices: one per (horizon, class), horizon-major, classes in order."""

    classes: FamilyClasses
    horizons_s: tuple[float, ...]
    choices: tuple[Choice, ...]

    def at(self, i: int) -> tuple[Choice, ...]:
        n = len(self.classes.names)
        return self.choices[i * n:(i + 1) * n]

    def needed(self, i: int) -> tuple[str, ...]:
        """Candidates with a weight at horizon i, by name."""
        return tuple(sorted({name for c in self.at(i) for name, _ in c.weights}))

    def combine(self, i: int, candidates: Mapping[str, np.ndarray], row_class: np.ndarray) -> np.ndarray:
        """The served forecast at horizon i, float64 (N,): each row's class's
        weights over candidates[name] (N,) (at least `needed(i)`)."""
        out = np.zeros(len(row_class))
        for c, choice in enumerate(self.at(i)):
            rows = np.flatnonzero(row_class == c)
            if not len(rows):
                continue
            value = np.zeros(len(rows))
            for name, weight in choice.weights:  # name order: the same sum for any subset of rows
                value += weight * candidates[name][rows]
            out[rows] = value
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"classes": {"edges_per_s": list(self.classes.edges_per_s), "names": list(self.classes.names)},
                "choices": [c.to_dict() for c in self.choices]}

    @classmethod
    def from_dict(cls, value: Any, horizons_s: Sequence[float], known: Sequence[str]) -> "Selection":
        """Strict: ValueError naming the key on anything malformed or on a
        weight for a candidate not in `known`."""
        if not isinstance(value, dict) or sorted(value) != ["choices", "classes"]:
            raise ValueError("selection: must be an object with exactly classes and choices")
        raw = value["classes"]
        if not isinstance(raw, dict) or sorted(raw) != ["edges_per_s", "names"]:
            raise ValueError("selection.classes: must be an object with exactly edges_per_s and names")
        classes = FamilyClasses(tuple(_number(e, "selection.classes.edges_per_s") for e in _list(raw["edges_per_s"])),
                                tuple(_text(n, "selection.classes.names") for n in _list(raw["names"])))
        classes.validate()
        items = _list(value["choices"])
        if len(items) != len(horizons_s) * len(classes.names):
            raise ValueError(f"selection.choices: {len(items)} choices for {len(horizons_s)} horizons x "
                             f"{len(classes.names)} classes")
        choices = []
        for j, item in enumerate(items):
            h, c = horizons_s[j // len(classes.names)], classes.names[j % len(classes.names)]
            choices.append(_choice(item, f"selection.choices[{j}]", h, c, known))
        return cls(classes, tuple(float(h) for h in horizons_s), tuple(choices))


def choose(candidates: Mapping[str, np.ndarray], truth: np.ndarray, row_class: np.ndarray,
           horizons_s: Sequence[float], baselines: Sequence[str], models: Sequence[str],
           classes: FamilyClasses, rules: SelectionRules) -> Selection:
    """The rule of the module docstring. candidates: name -> (N, horizons);
    truth: (N, horizons) counts of the validation rows; row_class (N,).
    baselines and models name the two kinds among candidates (at least one
    baseline)."""
    classes.validate()
    rules.validate(len(classes.names))
    if not baselines:
        raise ValueError("choose: at least one baseline candidate is needed")
    choices: list[Choice] = []
    for i, h in enumerate(horizons_s):
        columns = {name: np.asarray(values[:, i], dtype=np.float64) for name, values in candidates.items()}
        y = np.asarray(truth[:, i], dtype=np.float64)
        for c, name in enumerate(classes.names):
            rows = np.flatnonzero(row_class == c)
            own = _choose_rows(columns, y, rows, h, name, baselines, models, rules, rules.cap(c))
            if len(rows) < rules.min_rows:
                overall = _choose_rows(columns, y, np.arange(len(y)), h, ALL_CLASSES, baselines, models, rules,
                                       rules.cap(c))
                own = Choice(h, name, overall.chosen, overall.weights, own.validation_mae, len(rows), True)
            choices.append(own)
    return Selection(classes, tuple(float(h) for h in horizons_s), tuple(choices))


def _choose_rows(columns: Mapping[str, np.ndarray], y: np.ndarray, rows: np.ndarray, h: float, name: str,
                 baselines: Sequence[str], models: Sequence[str], rules: SelectionRules, cap: int) -> Choice:
    def mae(values: np.ndarray) -> float:
        return float(np.mean(np.abs(values[rows] - y[rows]))) if len(rows) else math.nan

    scores = {n: mae(v) for n, v in columns.items()}
    base = min(baselines, key=lambda n: _key(scores[n]))
    weights: tuple[tuple[str, float], ...] = ((base, 1.0),)
    chosen, blend_mae = base, scores[base]
    if models and len(rows) and cap > 0:
        model = min(models, key=lambda n: _key(scores[n]))
        j, blend_mae = _best_blend(columns[model][rows], columns[base][rows], y[rows], rules.blend_steps, cap)
        if j > 0 and blend_mae <= (1.0 - rules.margin) * scores[base]:
            n = rules.blend_steps
            weights = ((model, 1.0),) if j == n else tuple(sorted(((model, j / n), (base, (n - j) / n))))
            chosen = model if j == n else BLEND
    scores[BLEND] = blend_mae
    return Choice(float(h), name, chosen, weights, tuple(sorted(scores.items())), len(rows))


def _best_blend(model: np.ndarray, base: np.ndarray, y: np.ndarray, steps: int, cap: int) -> tuple[int, float]:
    """(j, MAE) of the best (j / steps) * model + ((steps - j) / steps) * base
    for j in 0..cap; ties: the smaller j."""
    best_j, best = 0, math.inf
    for j in range(cap + 1):
        value = float(np.mean(np.abs((j / steps) * model + ((steps - j) / steps) * base - y)))
        if value < best:
            best_j, best = j, value
    return best_j, best


def _key(score: float) -> float:
    return math.inf if math.isnan(score) else score


def _choice(item: Any, key: str, h: float, family_class: str, known: Sequence[str]) -> Choice:
    fields = ["chosen", "family_class", "horizon_s", "inherited", "rows", "validation_mae", "weights"]
    if not isinstance(item, dict) or sorted(item) != fields:
        raise ValueError(f"{key}: must be an object with exactly {', '.join(fields)}")
    if _number(item["horizon_s"], f"{key}.horizon_s") != h or item["family_class"] != family_class:
        raise ValueError(f"{key}: must be horizon {h:g} s, class {family_class!r} (horizon-major order)")
    weights = item["weights"]
    if not isinstance(weights, dict) or not weights:
        raise ValueError(f"{key}.weights: must be a non-empty object of candidate -> weight")
    for name, w in weights.items():
        if name not in known:
            raise ValueError(f"{key}.weights: {name!r} is not a candidate of this model ({', '.join(known)})")
        if not (0.0 < _number(w, f"{key}.weights.{name}") <= 1.0):
            raise ValueError(f"{key}.weights.{name}={w!r}: must be in (0, 1]")
    if abs(sum(weights.values()) - 1.0) > 1e-9:
        raise ValueError(f"{key}.weights: must sum to 1")
    mae = item["validation_mae"]
    if not isinstance(mae, dict):
        raise ValueError(f"{key}.validation_mae: must be an object of candidate -> MAE")
    scores = tuple(sorted((str(n), math.nan if v is None else _number(v, f"{key}.validation_mae.{n}"))
                          for n, v in mae.items()))
    rows, inherited = item["rows"], item["inherited"]
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0 or not isinstance(inherited, bool):
        raise ValueError(f"{key}: rows must be an integer >= 0 and inherited a boolean")
    return Choice(h, family_class, _text(item["chosen"], f"{key}.chosen"),
                  tuple(sorted((n, float(w)) for n, w in weights.items())), scores, rows, inherited)


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{value!r}: must be a list")
    return value


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key}={value!r}: must be a finite number")
    return float(value)


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key}={value!r}: must be a non-empty string")
    return value
