"""Online learning in the live predictor (issue 45, item 1): one worker
thread that asks the return model's OnlineReturnFitter
(fitting/returns/online.py) every check_s whether a fit is due, runs it off
every lock Forecast or ForecastReturns takes, and puts a validated model in
service through ReturnsCore.serve (an O(1) swap under that lock; at a cold
start, a tracker built and warmed off the lock, installed by one
assignment). step() is the same work, synchronously: what tests call.

The count model's online refits are the Retrainer's (fitting/retrain.py,
--retrain-interval-s), also in the background; served_models() reports both
for GetModelInfo.
"""
from __future__ import annotations

import logging
import threading

from speckv.services.predictor.fitting.retrain import Retrainer
from speckv.services.predictor.fitting.returns.online import FitOutcome, FitRecord, FitResult, OnlineReturnFitter
from speckv.services.predictor.serving.core import BUILTIN_SOURCE, PredictorCore
from speckv.services.predictor.serving.returns.features import ReturnFeatureSpec
from speckv.services.predictor.serving.returns.recalibration import RecalibrationSpec
from speckv.services.predictor.serving.returns.serving import ReturnsCore
from speckv.services.predictor.serving.returns.store import PastTurn, SavedReturnModel
from speckv.services.predictor.serving.served_models import ServedModelRecord

log = logging.getLogger(__name__)
BRIER = "held-out Brier (mean over horizons)"


class OnlineLearning:
    def __init__(self, fitter: OnlineReturnFitter, returns: ReturnsCore, spec: ReturnFeatureSpec,
                 recalibration: RecalibrationSpec, check_s: float = 10.0) -> None:
        if not check_s > 0:
            raise ValueError(f"check_s={check_s}: must be > 0")
        self._fitter, self._returns = fitter, returns
        self._spec, self._recalibration, self._check_s = spec, recalibration, check_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> FitResult | None:
        """A fit if one is due, served when it validated; None when none was due."""
        if not self._fitter.due():
            return None
        result = self._fitter.fit_now()
        if result.outcome is FitOutcome.SERVED and result.model is not None and result.record is not None:
            record = result.record
            saved = SavedReturnModel(result.model, self._spec, record.version,
                                     f"session-return model fitted online on [{record.window_start_s:.0f}, "
                                     f"{record.window_end_s:.0f}) s ({record.turn_ends} turn ends)", "online",
                                     self._recalibration)
            self._returns.serve(saved, self._history())
        log.info("online return fit: %s (%s)", result.outcome.value, result.reason)
        return result

    def _history(self) -> list[PastTurn]:
        turns, in_flight = self._fitter.replay()
        past = [PastTurn(t.conversation, t.arrival_s, t.end_s, t.prompt_tokens, t.output_tokens, t.follow_ups)
                for t in turns]
        past += [PastTurn(c, time_s, None, prompt, 0) for c, time_s, prompt in in_flight]
        return past

    def served(self) -> ServedModelRecord | None:
        served = self._fitter.served
        return None if served is None else return_record(served[1])

    # --- schedule --------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="predictor-online-learning", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self._check_s):
            try:
                self.step()
            except Exception:  # noqa: BLE001 - a failed fit must never end the worker (fit_now already guards)
                log.exception("online learning step failed")


def return_record(record: FitRecord) -> ServedModelRecord:
    fitted = record.origin != "warm start"
    return ServedModelRecord("return", record.version, record.origin,
                             record.window_start_s if fitted else 0.0, record.window_end_s if fitted else 0.0,
                             record.fitted_at_s if fitted else 0.0, record.turn_ends, BRIER if fitted else "",
                             record.holdout_score, record.replaced_score, online_learning=True)


def served_models(core: PredictorCore, returns: ReturnsCore, learning: OnlineLearning | None,
                  retrainer: Retrainer | None) -> list[ServedModelRecord]:
    """Each model in service, for GetModelInfo (ServedModel)."""
    info = core.model_info()
    count = retrainer.served if retrainer is not None and retrainer.served is not None \
        and retrainer.served.version == info.version else None
    out = [count or ServedModelRecord("count", info.version, "builtin" if info.source == BUILTIN_SOURCE else "loaded",
                                      online_learning=retrainer is not None)]
    online = learning.served() if learning is not None else None
    if online is not None and online.version == returns.model_version:
        out.append(online)
    elif returns.model_version:
        out.append(ServedModelRecord("return", returns.model_version, "loaded",
                                     online_learning=learning is not None))
    return out
