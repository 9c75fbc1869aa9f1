"""LightGBM forecaster (Booster API): per horizon one count model, level-relative,
with the upper quantile and the burst probability read from its distribution.

- Level offset. The count over horizon h (k steps) is modelled as
      expected = k * base * exp(f(x)),
  f the booster's raw score (objective from the config, poisson or tweedie,
  log link) trained with init_score = log(k * base). base is a causal level
  per step: the `ewma_hl<offset_halflife_s>s` feature shrunk toward the
  training rows' mean count per step mu by prior_steps pseudo-steps,
      base = (E * ewma + prior_steps * mu) / (E + prior_steps),
  E = 1 / (1 - decay) the EWMA's steady-state exposure in steps. Trees thus
  learn a ratio to the family's own recent level, not an absolute count, so
  a level shift between training and serving moves the forecast with it
  (absolute trees cannot extrapolate below the smallest level they saw), and
  a family with no history starts from mu instead of log(0).
- Distribution. Counts are negative binomial with that mean and dispersion
  phi_h (variance mu + phi mu^2), phi_h fitted by moments on the validation
  slice (held out from the trees, so residuals are honest; 0 = Poisson).
  upper = its `quantile` quantile; burst_probability = P(count > threshold)
  with the threshold of BURST_DEFINITION. One booster per horizon instead of
  three: a third of the training and of the forecast time, and the quantile
  and burst probability follow level shifts for free.
- alarm_threshold: the burst probability that maximises event F1 on the
  validation slice (never on reported rows), stored for consumers.
- Burst classifiers (burst_choice.py; trained by fitting/burst_model.py):
  at each horizon whose validation slice chose them (`burst`), the burst
  probability is their sigmoid(raw score) instead of the distribution's
  tail, and the alarm threshold is theirs.
Training (seeded, idle rows sampled, early stopping): fitting/lgbm_forecaster.py.

Served point forecast (`expected`): with a selection (selection.py, made by
point_fit.py) the expected count served at each horizon is the selection's
candidate or blend for the row's family class, over the candidates named in
`candidates_at` (the count booster's mean and median, the level-free l1
booster of level_free.py, the baselines of feature_baselines.py); without
one (a model saved before selections existed) it is the count booster's
mean. The upper quantile and burst probability always come from the count
booster's distribution (`mean`): the selection changes the point forecast
only.

Serving speed (issue 22, item 4): every booster's raw score comes from the
bundle's compiled trees where a model directory provided them
(`compiled`, compiled_trees.py), else from LightGBM's predict, the same
bits either way. One call's rows share what every horizon derives alike
(`_Batch`: the level offset's base, the level-free features' horizon-free
columns, the family classes). predict and expected_at split PARALLEL_MIN_ROWS
rows or more into two halves on two threads; every output row depends on
its own row alone, so that changes no bit.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar, cast

import lightgbm as lgb
import numpy as np

from speckv.services.predictor.serving import negbin
from speckv.services.predictor.serving.burst_choice import BURST_KIND, DISTRIBUTION, BurstChoice, probability
from speckv.services.predictor.serving.compiled_trees import CompiledTrees, raw_scores
from speckv.services.predictor.serving.feature_baselines import FeatureBaselines
from speckv.services.predictor.serving.feature_spec import FeatureSpec
from speckv.services.predictor.serving.level_free import LevelFreeRows, level_free_forecast
from speckv.services.predictor.serving.selection import Selection
from speckv.services.predictor.serving.targets import burst_threshold

KINDS = ("count",)
LEVEL_FREE_KIND = "l1"  # boosters["l1"]: the level-free boosters, when trained
MEAN, MEDIAN, LEVEL_FREE = "lightgbm", "lightgbm-median", "lightgbm-l1"
MODEL_CANDIDATES = (MEAN, MEDIAN, LEVEL_FREE)
# Below this many rows predict on one thread: waking a second thread is cheap
# on an idle machine but can cost tens of ms on a loaded one, more than a small
# batch's whole prediction (docs/performance.md, "LightGBM threads").
PARALLEL_MIN_ROWS = 2_000
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class LevelOffset:
    """base = (exposure * ewma + prior_steps * prior_per_step) / (exposure + prior_steps), per step."""

    halflife_s: float  # the ewma_hl<halflife_s>s feature is the level
    prior_per_step: float  # mu: mean count per step over the training rows
    prior_steps: float  # weight of mu, in pseudo-steps of history

    def column(self, spec: FeatureSpec) -> int:
        name = f"ewma_hl{self.halflife_s:g}s"
        if name not in spec.names():
            raise ValueError(f"offset halflife_s={self.halflife_s:g}: {name} is not a feature")
        return spec.names().index(name)

    def base(self, X: np.ndarray, spec: FeatureSpec) -> np.ndarray:
        """Level per step of each row, float64 (N,), > 0 when prior_per_step > 0."""
        exposure = 1.0 / (1.0 - spec.decay(self.halflife_s))
        ewma = X[:, self.column(spec)].astype(np.float64)
        return (exposure * ewma + self.prior_steps * self.prior_per_step) / (exposure + self.prior_steps)

    def log_base(self, X: np.ndarray, spec: FeatureSpec, k: int) -> np.ndarray:
        return np.log(np.maximum(k * self.base(X, spec), 1e-12))


@dataclass(slots=True)
class LgbmBundle:
    spec: FeatureSpec
    horizons_s: tuple[float, ...]
    quantile: float
    boosters: dict[str, list[lgb.Booster]]  # "count" (and "l1" when trained) -> one per horizon
    alarm_threshold: list[float]
    offset: LevelOffset
    dispersion: list[float]  # phi per horizon
    train_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    baselines: FeatureBaselines | None = None  # the baseline candidates, with a selection
    selection: Selection | None = None  # None: the served point forecast is the mean
    compiled: CompiledTrees | None = None  # the boosters as native code (compiled_trees.py); None: LightGBM's predict
    burst: BurstChoice | None = None  # the served burst probability's source per horizon; None: the distribution

    def steps(self) -> list[int]:
        return [round(h / self.spec.step_s) for h in self.horizons_s]

    def candidate_names(self) -> tuple[str, ...]:
        """Every candidate this bundle can compute."""
        models = MODEL_CANDIDATES if LEVEL_FREE_KIND in self.boosters else MODEL_CANDIDATES[:2]
        return (*models, *(self.baselines.names() if self.baselines is not None else ()))

    def mean(self, X: np.ndarray, num_threads: int = 2) -> np.ndarray:
        """The count booster's mean per row and horizon, float64 (N, horizons)."""
        batch = _Batch(self, X)
        out = np.empty((len(batch.X), len(self.horizons_s)))
        for i in range(len(self.horizons_s)):
            out[:, i] = self._mean_at(batch, i, num_threads)
        return out

    def expected(self, X: np.ndarray, num_threads: int = 2) -> np.ndarray:
        """The served point forecast per row and horizon, float64 (N, horizons)."""
        batch = _Batch(self, X)
        out = np.empty((len(batch.X), len(self.horizons_s)))
        for i in range(len(self.horizons_s)):
            out[:, i] = self._served_at(batch, i, num_threads, None)
        return out

    def expected_at(self, X: np.ndarray, i: int, num_threads: int = 2) -> np.ndarray:
        """The served point forecast at horizon i alone, float64 (N,): equal
        bit for bit to expected(X)[:, i] (every candidate scores each row
        alone, and the selection combines them row by row)."""
        return _by_halves(lambda part: self._served_at(_Batch(self, part), i, 1, None), X, num_threads)

    def _served_at(self, batch: "_Batch", i: int, num_threads: int, mean: np.ndarray | None) -> np.ndarray:
        """expected_at with the count booster's mean at horizon i when known."""
        if self.selection is None:
            return mean if mean is not None else self._mean_at(batch, i, num_threads)
        candidates = self._candidates(batch, i, self.selection.needed(i), num_threads, mean)
        return self.selection.combine(i, candidates, batch.classes())

    def row_classes(self, X: np.ndarray) -> np.ndarray:
        """Each row's family class (selection.py), int64 (N,)."""
        if self.selection is None:
            return np.zeros(len(X), dtype=np.int64)
        return self.selection.classes.classify(self.level_per_s(X))

    def level_per_s(self, X: np.ndarray) -> np.ndarray:
        """Each row's long-run level (the level_hl<L>s feature), arrivals per second."""
        return X[:, self.spec.column(f"level_hl{self.spec.long_halflife_s:g}s")]

    def candidates_at(self, X: np.ndarray, i: int, names: Sequence[str], num_threads: int = 2,
                      mean: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Each named candidate's point forecast at horizon i, float64 (N,);
        mean: the count booster's at horizon i, when already computed."""
        return self._candidates(_Batch(self, X), i, names, num_threads, mean)

    def _candidates(self, batch: "_Batch", i: int, names: Sequence[str], num_threads: int,
                    mean: np.ndarray | None) -> dict[str, np.ndarray]:
        k = self.steps()[i]
        out: dict[str, np.ndarray] = {}
        if mean is None and (MEAN in names or MEDIAN in names):
            mean = self._mean_at(batch, i, num_threads)
        for name in names:
            if name == MEAN:
                out[name] = mean
            elif name == MEDIAN:
                out[name] = negbin.quantile(0.5, mean, self.dispersion[i])
            elif name == LEVEL_FREE and LEVEL_FREE_KIND in self.boosters and self.baselines is not None:
                g = self._raw(LEVEL_FREE_KIND, i, batch.level_free().at(k), num_threads)
                out[name] = level_free_forecast(g, batch.base, k)
            elif self.baselines is not None and name in self.baselines.names():
                out[name] = self.baselines.forecast(name, batch.X, k)
            else:
                raise ValueError(f"{name!r}: not a candidate of this model ({', '.join(self.candidate_names())})")
        return out

    def _mean_at(self, batch: "_Batch", i: int, num_threads: int) -> np.ndarray:
        return self.steps()[i] * batch.base * np.exp(self._raw("count", i, batch.X, num_threads))

    def _raw(self, kind: str, i: int, X: np.ndarray, num_threads: int) -> np.ndarray:
        """Booster kind at horizon i's raw score on X: the compiled trees
        where loaded, else LightGBM's predict; the same bits either way."""
        threads = num_threads if len(X) >= PARALLEL_MIN_ROWS else 1
        return raw_scores(self.compiled, self.boosters, kind, i, X, threads)

    def predict(self, X: np.ndarray, num_threads: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """expected (the served point forecast), upper, burst probability
        (both from the count booster's distribution): each (N, horizons)
        float64. With num_threads > 1 and at least PARALLEL_MIN_ROWS rows,
        the two halves of the rows run on two threads (every output row
        depends on its own row alone, so the bits are the same)."""
        return _by_halves(self._predict_rows, X, num_threads)

    def _predict_rows(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        batch = _Batch(self, X)
        mean = np.empty((len(batch.X), len(self.horizons_s)))
        for i in range(len(self.horizons_s)):
            mean[:, i] = self._mean_at(batch, i, 1)
        expected = np.empty_like(mean)
        for i in range(len(self.horizons_s)):
            expected[:, i] = self._served_at(batch, i, 1, mean[:, i])
        level = self.level_per_s(batch.X)
        upper, prob = np.empty_like(mean), np.empty_like(mean)
        for i, h in enumerate(self.horizons_s):
            phi = self.dispersion[i]
            upper[:, i] = negbin.quantile(self.quantile, mean[:, i], phi)
            if self.burst is None or self.burst.sources[i] == DISTRIBUTION:
                threshold = burst_threshold(level, h, self.spec.burst_ratio, self.spec.min_burst_count)
                prob[:, i] = negbin.exceed_probability(threshold, mean[:, i], phi)
            else:
                prob[:, i] = probability(self._raw(BURST_KIND, i, batch.X, 1))
        return expected, upper, np.clip(prob, 0.0, 1.0)


class _Batch:
    """One call's rows (float32, C order) and what every horizon derives
    from them alike (the level offset's base, the level-free features'
    horizon-free columns, the family classes), each computed once."""

    __slots__ = ("X", "base", "_bundle", "_level_free", "_classes")

    def __init__(self, bundle: LgbmBundle, X: np.ndarray) -> None:
        self.X = np.ascontiguousarray(X, dtype=np.float32)
        self.base = bundle.offset.base(self.X, bundle.spec)
        self._bundle = bundle
        self._level_free: LevelFreeRows | None = None
        self._classes: np.ndarray | None = None

    def level_free(self) -> LevelFreeRows:
        if self._level_free is None:
            b = self._bundle
            if b.baselines is None:
                raise ValueError("the level-free features need the model's baselines")
            self._level_free = LevelFreeRows(self.X, b.spec, self.base, b.baselines)
        return self._level_free

    def classes(self) -> np.ndarray:
        if self._classes is None:
            self._classes = self._bundle.row_classes(self.X)
        return self._classes


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _by_halves(compute: Callable[[np.ndarray], _T], X: np.ndarray, num_threads: int) -> _T:
    """compute(X) on one thread, or, with num_threads > 1 and at least
    PARALLEL_MIN_ROWS rows, compute on each half of the rows on two threads
    and the halves joined (compute returns an array or a tuple of arrays,
    one row per row of X; each row must depend on its own row alone).
    Threads rather than the libraries' own: every step of a forecast is
    row-wise, so the halves overlap the features, the trees and the
    distribution alike, and a Python thread that is descheduled only waits
    instead of spinning at an OpenMP barrier."""
    global _pool
    X = np.ascontiguousarray(X, dtype=np.float32)
    if num_threads < 2 or len(X) < PARALLEL_MIN_ROWS:
        return compute(X)
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lgbm-rows")
        pool = _pool
    half = len(X) // 2
    later = pool.submit(compute, X[half:])
    first = compute(X[:half])
    halves: tuple[Any, Any] = (first, later.result())
    if isinstance(first, tuple):
        return cast(_T, tuple(np.concatenate(pair) for pair in zip(*halves)))
    return cast(_T, np.concatenate(halves))
