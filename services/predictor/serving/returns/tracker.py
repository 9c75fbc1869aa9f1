"""ReturnTracker: the online core that holds open conversations and answers
"who comes back soon".

Fed in time order (each call names its `now`, seconds; the tracker reads no
clock): arrival(conversation, now, ...) when a request arrives, turn_end(
conversation, now, arrival_s, ...) when a turn's answer completes. A turn end
opens the conversation (its feature row comes from a ReturnFeatures, the
builder the offline dataset uses); the conversation's next arrival closes it
and forgets its pending forecast. A turn end whose conversation has already
sent a later request is not opened (it has returned). At most
max_open_conversations are open: a new one beyond that drops the one whose
turn ended least recently (LRU); one idle longer than max_idle_s is dropped
when forecasts are asked for.

forecast(now): for each open conversation, a = now - end (seconds idle) and,
for every model horizon t, P(it returns within t of now | not returned by
now) = (F(a + t) - F(a)) / (1 - F(a)), plus the expected seconds from now to
its return, E[min(T - a, t_n) | T > a] (survival.py says how F is
interpolated between horizons and extended past the last with the model's
tail). The model's
horizon probabilities are computed once per turn end, in one batch at the
next forecast, and kept until the conversation closes or the model changes.

Recalibration (optional, recalibration.py; off by default): with an enabled
RecalibrationSpec every opened turn end also enters a LevelRecalibrator
with the model's own probabilities for it (scored in the same batch, even
when the conversation has closed by then), every arrival is its return, and
each forecast at `now` shifts every open conversation's horizon
probabilities by the recalibrator's shift(now) before the curve is built:
the same rule, on the same turn ends, as the offline recalibrate_rows.
Turn ends awaiting a score are scored in a batch once MAX_UNSCORED wait, so
their memory stays bounded between forecasts. set_model starts the
recalibrator afresh (its evidence described the old model's predictions).
Disabled, the forecasts are exactly those without it.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

import numpy as np

from speckv.services.predictor.serving.returns import survival
from speckv.services.predictor.serving.returns.features import ReturnFeatures, ReturnFeatureSpec
from speckv.services.predictor.serving.returns.recalibration import (
    LevelRecalibrator,
    PendingEnd,
    RecalibrationSpec,
    apply_shift,
)

MAX_UNSCORED = 4096  # turn ends held for the recalibrator before they are scored without a forecast


class CdfModel(Protocol):
    """What the tracker needs of a model (model.ReturnModel is one)."""

    horizons_s: tuple[float, ...]
    feature_names: tuple[str, ...]
    tail: survival.Tail | None

    def predict_cdf(self, X: np.ndarray, num_threads: int = 1) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class ReturnForecast:
    """One open conversation's outlook at `now`. p_within maps each horizon
    t (seconds from now) to P(next turn arrives within t | not yet);
    expected_s is the expected seconds from now to it, capped at the longest
    horizon (never returning counts as that cap)."""

    conversation: str
    end_s: float
    idle_s: float
    p_within: Mapping[float, float]
    expected_s: float


@dataclass(frozen=True, slots=True)
class ReturnForecastBatch:
    """ReturnForecast fields as arrays, one row per open conversation:
    p_within (N, len(horizons_s)), the rest (N,); seconds throughout."""

    horizons_s: tuple[float, ...]
    conversations: tuple[str, ...]
    end_s: np.ndarray
    idle_s: np.ndarray
    p_within: np.ndarray
    expected_s: np.ndarray


@dataclass(slots=True)
class _Open:
    end_s: float
    row: np.ndarray
    cdf: np.ndarray | None = None  # the model's own (un-shifted) horizon probabilities
    model_serial: int = 0  # the tracker's model serial cdf was scored by (a swap makes it stale)
    pending: PendingEnd | None = None  # its entry in the recalibrator, if one runs


class ReturnTracker:
    """Open conversations and their conditional return forecasts. Not thread-safe."""

    def __init__(self, model: CdfModel, spec: ReturnFeatureSpec, max_open_conversations: int = 100_000,
                 max_idle_s: float = math.inf, recalibration: RecalibrationSpec | None = None) -> None:
        if max_open_conversations < 1 or not max_idle_s > 0:
            raise ValueError("max_open_conversations must be >= 1 and max_idle_s > 0")
        self.features = ReturnFeatures(spec)
        self.max_open = max_open_conversations
        self.max_idle_s = max_idle_s
        self._open: OrderedDict[str, _Open] = OrderedDict()
        self._model = model
        self._model_serial = 0
        self._check(model)
        self.recalibration = recalibration if recalibration is not None and recalibration.enabled else None
        self._recalibrator = self._new_recalibrator()
        self._unscored: list[_Open] = []  # opened turn ends the recalibrator still needs a score for

    @property
    def model(self) -> CdfModel:
        return self._model

    def set_model(self, model: CdfModel) -> None:
        """Swaps the model in O(1): open conversations are scored again by it
        at the next forecast (their cdf is stale once the serial moved)."""
        self._check(model)
        self._model = model
        self._model_serial += 1
        # Not re-entering the open ones: those that already returned are gone, so they would bias it low.
        self._recalibrator = self._new_recalibrator()
        self._unscored = []

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, conversation: object) -> bool:
        return conversation in self._open

    def arrival(self, conversation: str, now: float, prompt_tokens: int = 0) -> None:
        """A request of the conversation arrived: it is no longer pending."""
        self.features.arrival(conversation, now, prompt_tokens)
        self._open.pop(conversation, None)
        if self._recalibrator is not None:
            self._recalibrator.arrival(conversation, self.features.now)

    def turn_end(self, conversation: str, now: float, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 signal: float = 0.0) -> bool:
        """The turn that arrived at arrival_s completed at now; True when the
        conversation is now open (awaiting its next turn)."""
        row = self.features.turn_end(conversation, now, arrival_s, prompt_tokens, output_tokens, signal)
        if self.features.returned_since(conversation, arrival_s) is not None:
            return False
        self._open.pop(conversation, None)
        entry = self._open[conversation] = _Open(self.features.now, row, model_serial=self._model_serial)
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)
        if self._recalibrator is not None:
            self._track(entry, conversation)
            if len(self._unscored) >= MAX_UNSCORED:
                self._score([])
        return True

    def forecast(self, now: float) -> list[ReturnForecast]:
        """Every open conversation's conditional forecast, oldest turn end first."""
        batch = self.forecast_batch(now)
        horizons = batch.horizons_s
        return [ReturnForecast(conversation, end, idle, dict(zip(horizons, ps)), expected)
                for conversation, end, idle, ps, expected in zip(batch.conversations, batch.end_s.tolist(),
                                                                 batch.idle_s.tolist(), batch.p_within.tolist(),
                                                                 batch.expected_s.tolist())]

    def forecast_batch(self, now: float) -> "ReturnForecastBatch":
        """forecast(now) as arrays (no object per conversation: the form for
        many thousands of open conversations)."""
        horizons = tuple(self._model.horizons_s)
        scored = self._scored(now)
        if scored is None:
            empty = np.zeros(0)
            return ReturnForecastBatch(horizons, (), empty, empty, np.zeros((0, len(horizons))), empty)
        end, idle, curve = scored
        alive = curve.at(idle)[0]
        p = np.stack([curve.within(idle, t, alive) for t in horizons], axis=1)
        return ReturnForecastBatch(horizons, tuple(self._open), end, idle, p, curve.expected_remaining(idle))

    def p_within(self, now: float, within_s: float) -> tuple[tuple[str, ...], np.ndarray]:
        """(open conversations, P(each returns within within_s of now | not
        yet)): one window of any length, for a planner acting on it."""
        scored = self._scored(now)
        if scored is None:
            return (), np.zeros(0)
        _, idle, curve = scored
        return tuple(self._open), curve.within(idle, within_s)

    def p_within_grid(self, now: float, within_s: Sequence[float]) -> tuple[tuple[str, ...], np.ndarray]:
        """(open conversations, (N, K) P(each returns within each of within_s
        of now | not yet)): the curve a planner reads a window's share from."""
        scored = self._scored(now)
        if scored is None:
            return (), np.zeros((0, len(within_s)))
        _, idle, curve = scored
        alive = curve.at(idle)[0]
        return tuple(self._open), np.stack([curve.within(idle, t, alive) for t in within_s], axis=1)

    def _scored(self, now: float) -> "tuple[np.ndarray, np.ndarray, survival.SurvivalCurve] | None":
        """Drops conversations idle past max_idle_s, scores new turn ends in
        one batch; (end, idle, curve) of the open ones, None when none is."""
        horizon_end = now - self.max_idle_s
        for conversation in [c for c, e in self._open.items() if e.end_s < horizon_end]:
            del self._open[conversation]
        entries = list(self._open.values())
        self._score(entries)
        shift = None if self._recalibrator is None else self._recalibrator.shift(now)
        if not entries:
            return None
        cdf = np.stack([e.cdf for e in entries])
        if shift is not None:
            cdf = apply_shift(cdf, shift)
        end = np.array([e.end_s for e in entries])
        idle = np.maximum(now - end, 0.0)
        return end, idle, survival.SurvivalCurve(cdf, self._model.horizons_s, self._model.tail)

    def level_shift(self, now: float) -> np.ndarray | None:
        """The recalibrator's logit shift per horizon at now, (H,); None when
        recalibration is off."""
        if self._recalibrator is None:
            return None
        self._score([])
        return self._recalibrator.shift(now)

    def _score(self, entries: list[_Open]) -> None:
        """Scores, in one batch, the entries without a cdf and every turn end
        the recalibrator waits on; hands the latter their probabilities."""
        serial = self._model_serial
        todo = {id(e): e for e in entries if e.cdf is None or e.model_serial != serial}
        todo.update((id(e), e) for e in self._unscored if e.cdf is None)
        if todo:
            batch = list(todo.values())
            for entry, cdf in zip(batch, self._model.predict_cdf(np.stack([e.row for e in batch]))):
                entry.cdf, entry.model_serial = cdf, serial
        if self._recalibrator is not None:
            for entry in self._unscored:
                if entry.pending is not None and entry.pending.p is None:
                    self._recalibrator.set_prediction(entry.pending, entry.cdf)
        self._unscored = []

    def _new_recalibrator(self) -> LevelRecalibrator | None:
        if self.recalibration is None:
            return None
        return LevelRecalibrator(self.recalibration, self._model.horizons_s)

    def _track(self, entry: _Open, conversation: str) -> None:
        """Enters an opened turn end into the recalibrator (its score follows)."""
        assert self._recalibrator is not None
        entry.pending = self._recalibrator.turn_end(conversation, entry.end_s)
        self._unscored.append(entry)

    def _check(self, model: CdfModel) -> None:
        if tuple(model.feature_names) != self.features.names():
            raise ValueError(f"model features {model.feature_names} != builder features {self.features.names()}")
