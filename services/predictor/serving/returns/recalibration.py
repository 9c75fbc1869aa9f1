"""Online, causal level recalibration of the horizon probabilities.

Why: return rates drift over the trace (on the Mooncake hour they rise), so a
model fitted on the past is off mostly by its level, not its ranking. This
shifts each horizon's probability in logit space by the gap, measured on
recent turn ends whose outcome is already known, between how often they
came back and how often the model said they would.

The rule (horizon t, prediction time `now`, seconds):
- the evidence is the turn ends e whose horizon-t window closed in
  (now - window_s, now]: e + t <= now (the window fully elapsed: the same
  "resolved windows only" rule as features.py's return_share_<t>s, so
  nothing after `now` and no still-open window enters), e + t > now - window_s;
- n of them, y of them came back by e + t, and the model had given them
  probabilities summing to s (the model's own, un-shifted F_t at their end);
- p_bar = s / n and the observed rate shrunk toward it with prior_rows
  pseudo-rows: r = (y + prior_rows p_bar) / (n + prior_rows), so a handful
  of rows barely moves it;
- shift = clip(logit(r) - logit(p_bar), -max_shift_logit, +max_shift_logit),
  0 when n = 0 (probabilities clipped to [EPS, 1 - EPS] before the logit);
- a probability p becomes expit(logit(p) + shift) (p untouched where the
  shift is exactly 0), and the horizons are made monotone again
  (survival.monotone), as the model's own output is.

LevelRecalibrator is the one online core: fed turn ends (with the model's
prediction for them, possibly later, before the next shift()) and arrivals
in time order, it answers shift(now). It reads no clock and holds no global
state; `now` going backwards is clamped to the latest time seen, as in
features.py. recalibrate_rows replays offline rows through it, so offline
(bench) and live (tracker) shifts cannot drift. Disabled (spec.enabled
false) nothing is shifted anywhere: the output is the model's, bit for bit.

Bounded state: turn ends wait until their longest horizon's window has
closed, resolved ones until they leave the window; per conversation only its
newest pending turn end is held (its next arrival is that end's return).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from speckv.services.predictor.serving.returns import survival

EPS = 1e-6  # probabilities are clipped to [EPS, 1 - EPS] before a logit


@dataclass(frozen=True, slots=True)
class RecalibrationSpec:
    """Invariants: window_s > 0 (seconds), prior_rows >= 0 (pseudo-rows),
    max_shift_logit >= 0 (logit units), all finite."""

    enabled: bool = False
    window_s: float = 1200.0
    prior_rows: float = 200.0
    max_shift_logit: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"recalibration.window_s={self.window_s!r}: must be finite and > 0")
        if not (math.isfinite(self.prior_rows) and self.prior_rows >= 0):
            raise ValueError(f"recalibration.prior_rows={self.prior_rows!r}: must be finite and >= 0")
        if not (math.isfinite(self.max_shift_logit) and self.max_shift_logit >= 0):
            raise ValueError(f"recalibration.max_shift_logit={self.max_shift_logit!r}: must be finite and >= 0")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> "RecalibrationSpec":
        """The `recalibration` object of the config or a manifest (keys
        other than the fields, e.g. "about", are ignored); None: off."""
        if raw is None:
            return cls()
        enabled = raw.get("enabled", False)
        if not isinstance(enabled, bool):
            raise ValueError(f"recalibration.enabled={enabled!r}: must be true or false")
        values = []
        for key, default in (("window_s", 1200.0), ("prior_rows", 200.0), ("max_shift_logit", 1.0)):
            value = raw.get(key, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"recalibration.{key}={value!r}: must be a number")
            values.append(float(value))
        return cls(enabled, *values)

    def to_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "window_s": self.window_s, "prior_rows": self.prior_rows,
                "max_shift_logit": self.max_shift_logit}

    def scaled(self, speed: float) -> "RecalibrationSpec":
        """The same rule on a clock running speed x (training.scaled_spec)."""
        return RecalibrationSpec(self.enabled, self.window_s / speed, self.prior_rows, self.max_shift_logit)


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


def expit(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def level_shift(rows: np.ndarray, returned: np.ndarray, predicted: np.ndarray, spec: RecalibrationSpec
                ) -> np.ndarray:
    """The logit shift per horizon (module docstring) from each horizon's
    evidence: rows n, returned y and summed predictions s, (H,) each."""
    n = np.asarray(rows, dtype=np.float64)
    y, s = np.asarray(returned, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    has = n > 0
    p_bar = np.where(has, s / np.where(has, n, 1.0), 0.5)
    rate = (y + spec.prior_rows * p_bar) / np.where(has, n + spec.prior_rows, 1.0)
    shift = np.clip(logit(rate) - logit(p_bar), -spec.max_shift_logit, spec.max_shift_logit)
    return np.where(has, shift, 0.0)


def apply_shift(cdf: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """cdf (N, H) moved by shift (H,) in logit space, monotone again.
    Columns whose shift is 0 are left exactly as they were."""
    cdf = np.asarray(cdf, dtype=np.float64)
    shift = np.asarray(shift, dtype=np.float64)
    moved = shift != 0.0
    if not moved.any():
        return cdf
    out = cdf.copy()
    out[..., moved] = expit(logit(cdf[..., moved]) + shift[moved])
    return survival.monotone(out)


@dataclass(slots=True)
class PendingEnd:
    """A turn end awaiting resolution: its time, the model's un-shifted
    horizon probabilities (set before the next shift()) and its return."""

    end_s: float
    p: np.ndarray | None = None  # float64 (H,)
    return_s: float | None = None


class LevelRecalibrator:
    """The online core (module docstring). Not thread-safe."""

    def __init__(self, spec: RecalibrationSpec, horizons_s: Sequence[float]) -> None:
        self.spec = spec
        self.horizons_s = tuple(float(h) for h in horizons_s)
        self._now = -math.inf
        self._newest: dict[Hashable, PendingEnd] = {}  # per key, its pending end not yet returned
        self._pending = [deque[tuple[Hashable, PendingEnd]]() for _ in self.horizons_s]
        # per horizon: (closes_s, p, returned) of resolved ends, and their running sums
        self._resolved = [deque[tuple[float, float, bool]]() for _ in self.horizons_s]
        self._n = [0] * len(self.horizons_s)
        self._y = [0] * len(self.horizons_s)
        self._s = [0.0] * len(self.horizons_s)

    @property
    def now(self) -> float:
        return self._now

    def _clamp(self, now: float) -> float:
        self._now = max(float(now), self._now)
        return self._now

    def turn_end(self, key: Hashable, now: float, p: np.ndarray | None = None) -> PendingEnd:
        """A turn of `key` (the conversation) ended at now; p is the model's
        un-shifted (H,) prediction for it, or None to set later (set_prediction)
        before the next shift(). Returns its handle."""
        end = PendingEnd(self._clamp(now), None)
        if p is not None:
            self.set_prediction(end, p)
        self._newest[key] = end
        for pending in self._pending:
            pending.append((key, end))
        return end

    def set_prediction(self, end: PendingEnd, p: np.ndarray) -> None:
        p = np.asarray(p, dtype=np.float64).reshape(-1)
        if len(p) != len(self.horizons_s):
            raise ValueError(f"prediction has {len(p)} horizons, the recalibrator {len(self.horizons_s)}")
        end.p = p

    def arrival(self, key: Hashable, now: float) -> None:
        """A request of `key` arrived at now: its pending end has returned."""
        now = self._clamp(now)
        end = self._newest.pop(key, None)
        if end is not None:
            end.return_s = now

    def shift(self, now: float) -> np.ndarray:
        """The logit shift per horizon at now, (H,): resolves the ends whose
        window closed by now (each must have its prediction by then) and
        drops the evidence that left the window."""
        now = self._clamp(now)
        for i, horizon in enumerate(self.horizons_s):
            pending, resolved = self._pending[i], self._resolved[i]
            while pending and pending[0][1].end_s + horizon <= now:
                key, end = pending.popleft()
                if end.p is None:
                    raise ValueError("a turn end resolved before its prediction was set (set_prediction)")
                closes = end.end_s + horizon
                returned = end.return_s is not None and end.return_s <= closes
                p = float(end.p[i])
                resolved.append((closes, p, returned))
                self._n[i] += 1
                self._y[i] += returned
                self._s[i] += p
                if i == len(self.horizons_s) - 1 and self._newest.get(key) is end:
                    del self._newest[key]  # resolved at every horizon: a later return no longer matters
            while resolved and resolved[0][0] <= now - self.spec.window_s:
                _, p, returned = resolved.popleft()
                self._n[i] -= 1
                self._y[i] -= returned
                self._s[i] -= p
            if not resolved:
                self._s[i] = 0.0  # running float sums: reset drift when the window empties
        return level_shift(np.array(self._n), np.array(self._y), np.array(self._s), self.spec)


def recalibrate_rows(end_s: np.ndarray, delay_s: np.ndarray, cdf: np.ndarray, horizons_s: Sequence[float],
                     spec: RecalibrationSpec) -> tuple[np.ndarray, np.ndarray]:
    """Offline: rows (turn ends at end_s, next arrival delay_s later, +inf:
    none; the model's un-shifted cdf (N, H)) replayed in time order through
    one LevelRecalibrator, each row's return fed as its key's arrival (an
    arrival before an end at the same time, as dataset.build_rows does).
    Returns (the cdf shifted at each row's own end, the shifts (N, H)).
    Row i's shift reads only rows whose window closed by end_s[i]."""
    end_s, delay_s = np.asarray(end_s, dtype=np.float64), np.asarray(delay_s, dtype=np.float64)
    cdf = np.asarray(cdf, dtype=np.float64)
    events: list[tuple[float, int, int]] = []
    for i, (end, delay) in enumerate(zip(end_s.tolist(), delay_s.tolist())):
        events.append((end, 1, i))
        if math.isfinite(delay):
            events.append((end + delay, 0, i))
    events.sort()
    core = LevelRecalibrator(spec, horizons_s)
    shifts = np.zeros((len(end_s), len(core.horizons_s)))
    for time_s, kind, i in events:
        if kind == 0:
            core.arrival(i, time_s)
        else:
            core.turn_end(i, time_s, cdf[i])
            shifts[i] = core.shift(time_s)
    # apply_shift row by row, vectorised: monotone() leaves an unshifted (already monotone) row as it is
    moved = shifts != 0.0
    out = np.where(moved, expit(logit(cdf) + shifts), cdf)
    return survival.monotone(out), shifts
