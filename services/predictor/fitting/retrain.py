"""Online retraining: a background thread that retrains LightGBM on the
window the core holds (a sliding window: the series keeps the last window_s)
every interval_s, validates the candidate and swaps it in atomically.

Validation (a candidate that fails is discarded, the model in service stays):
- every output finite on the validation slice (the newest steps);
- its count MAE at the reference horizon (the middle trained horizon) on that
  slice at most (1 + tolerance) x the best of: the EWMA baseline on the same
  rows, and the LightGBM model in service when it reads the same features.
  The candidate's count is its served point forecast (the choice made on
  that same slice, selection.py), so this guards against a broken candidate,
  not a second test of the choice.
Swap: the candidate is written as a model directory (boosters, then the
manifest, atomically), read back through load_model like any ReloadModel,
and installed with one assignment under the core's lock, so a Forecast sees
either the old model or the new one, never a mix.
"""
from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse

from speckv.services.predictor.fitting.family_counts import FamilyCounts
from speckv.services.predictor.fitting.lgbm_forecaster import is_sane
from speckv.services.predictor.fitting.lgbm_save import save_model
from speckv.services.predictor.fitting.training import TrainingConfig, train_on_counts
from speckv.services.predictor.judging.evaluation import mae
from speckv.services.predictor.serving.core import PredictorCore
from speckv.services.predictor.serving.feature_baselines import EWMA, FeatureBaselines
from speckv.services.predictor.serving.lgbm_served import LightGbmModel
from speckv.services.predictor.serving.manifest import load_model
from speckv.services.predictor.serving.served_models import ServedModelRecord

log = logging.getLogger(__name__)


class RetrainOutcome(enum.Enum):
    SWAPPED = "swapped"
    REJECTED = "rejected"  # trained, failed validation
    SKIPPED = "skipped"  # too little history to train on
    FAILED = "failed"  # training raised


@dataclass(slots=True)
class RetrainResult:
    outcome: RetrainOutcome
    reason: str
    version: str = ""
    candidate_mae: float = float("nan")
    reference_mae: float = float("nan")


@dataclass(frozen=True, slots=True)
class RetrainSettings:
    directory: Path  # model versions are written under it
    interval_s: float = 300.0
    min_history_s: float = 120.0
    min_arrivals: int = 0  # the first fit waits for this many arrivals in the window too
    tolerance: float = 0.05
    ewma_halflife_s: float = 10.0


class Retrainer:
    def __init__(self, core: PredictorCore, config: TrainingConfig, settings: RetrainSettings) -> None:
        self._core, self._config, self._settings = core, config, settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._serial = 0
        self.last: RetrainResult | None = None
        self.served: ServedModelRecord | None = None  # the last candidate swapped in (GetModelInfo)

    def retrain_once(self) -> RetrainResult:
        try:
            result = self._retrain()
        except Exception as exc:  # a broken candidate must never take the service down
            log.exception("retrain failed")
            result = RetrainResult(RetrainOutcome.FAILED, f"{type(exc).__name__}: {exc}")
        self.last = result
        return result

    def _retrain(self) -> RetrainResult:
        families, window, first, step_s = self._core.snapshot()
        active = window.sum(axis=0).nonzero()[0]
        if not families or not len(active) or (active[-1] - active[0] + 1) * step_s < self._settings.min_history_s:
            return RetrainResult(RetrainOutcome.SKIPPED, "less than min_history_s of history in the window")
        if int(window.sum()) < self._settings.min_arrivals:
            return RetrainResult(RetrainOutcome.SKIPPED, f"fewer than min_arrivals={self._settings.min_arrivals} "
                                 "arrivals in the window")
        start = int(active[0])  # the window before the first arrival was never observed
        counts = FamilyCounts(families, sparse.csr_matrix(window[:, start:].astype(np.float64)), step_s,
                              (first + start) * step_s)
        keep = np.flatnonzero(np.diff(counts.counts.indptr) > 0)
        counts = FamilyCounts([families[i] for i in keep], counts.counts[keep], step_s, counts.start_s)
        trained = train_on_counts(counts, self._config)
        valid, bundle = trained.validation, trained.bundle
        # the EWMA baseline read off the candidate's own features (training may add lags, moving columns)
        ewma = FeatureBaselines(bundle.spec, self._settings.ewma_halflife_s)
        if not len(valid):
            return RetrainResult(RetrainOutcome.SKIPPED, "no validation rows")
        if not is_sane(bundle, valid.X):
            return RetrainResult(RetrainOutcome.REJECTED, "candidate produced non-finite forecasts")
        ref = len(self._config.horizons_s) // 2
        truth = valid.count[:, ref].astype(np.float64)
        candidate = mae(bundle.predict(valid.X)[0][:, ref], truth)
        reference = mae(ewma.forecast(EWMA, valid.X, bundle.steps()[ref]), truth)
        serving = self._core.serving_model
        if isinstance(serving, LightGbmModel) and serving.feature_spec == bundle.spec:
            reference = min(reference, mae(serving.bundle.predict(valid.X)[0][:, ref], truth))
        if not candidate <= (1.0 + self._settings.tolerance) * reference:
            return RetrainResult(RetrainOutcome.REJECTED,
                                 f"validation MAE {candidate:.4f} above reference {reference:.4f}",
                                 candidate_mae=candidate, reference_mae=reference)
        self._serial += 1
        version = f"online-{self._serial}-step{first + int(window.shape[1]) - 1}"
        metrics = {f"valid_mae_{self._config.horizons_s[ref]:g}s": candidate, "train_s": bundle.train_s}
        directory = self._settings.directory / version
        save_model(directory, LightGbmModel(bundle, version, metrics, trace="online window"))
        self._core.install(load_model(directory), str(directory))
        window_s = ((first + start) * step_s, (first + int(window.shape[1])) * step_s)
        self.served = ServedModelRecord("count", version, "online", window_s[0], window_s[1],
                                        self._core.model_info().loaded_at_s, len(counts.families),
                                        f"validation MAE at {self._config.horizons_s[ref]:g} s", candidate,
                                        reference, online_learning=True)
        return RetrainResult(RetrainOutcome.SWAPPED, "validated", version, candidate, reference)

    # --- schedule --------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="predictor-retrain", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self._settings.interval_s):
            result = self.retrain_once()
            log.info("retrain: %s (%s)", result.outcome.value, result.reason)
