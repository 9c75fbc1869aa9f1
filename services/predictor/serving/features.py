"""Features of a family's arrival history, in a batch form and an incremental form.

A row of features describes family f at the end of step s (what a live
predictor knows once step s is complete). Counts are arrivals per step; the
history starts at the origin step (no arrivals were observed before it, so
they count as zeros). With `spec = FeatureSpec(...)`, in `spec.names()` order:

- lag_k: the count of step s - k + 1 (lag_1 is step s itself), k in `lags`;
- mean_w, max_w, std_w: over the trailing w steps (s - w, s], w in `windows`
  (std is the population std, from exact integer sums);
- ewma_hl<h>s: exponentially weighted mean count per step, half-life h
  seconds, divided by the same EWMA of a series of ones (exposure
  correction, so a short history is not read as a low level);
- level_hl<L>s: the family's long-run level in arrivals per second, the EWMA
  with half-life long_halflife_s: the trailing level of BURST_DEFINITION;
- ratio_hl<h>s: ewma_hl<h>s / (level per step + RATIO_EPS): how far the
  family is above its own long-run level;
- since_burst_s: seconds since the family's last burst step, capped at cap_s.
  Step s is a burst step when the arrivals of (s - burst_span, s] exceed
  max(burst_ratio * level * burst_span * step_s, min_burst_count), the level
  taken at s - 1: BURST_DEFINITION over a span of burst_span steps;
- since_arrival_s: seconds since the family's last arrival (capped);
- turns: arrivals so far, capped at turn_cap (a conversation's turn index);
- cluster_lag_1, cluster_ewma_hl<h>s: the same for the cluster-wide total;
- rise_<w>, accel_<w>, cluster_rise_<w>, cluster_accel_<w>, rising_<w> for
  each w in trend_spans (none by default): the trend features of trend.py
  (slope and acceleration of the family's and the cluster's counts, and how
  many families rise together);
- tod_sin, tod_cos: time of day of the end of step s (tod_offset_s is the
  wall-clock second of day of absolute step 0's start); only with
  time_of_day (see periodic_features_usable: a periodic term is kept only
  when the training history spans MIN_PERIODS of its period, else a tree
  sees every test phase for the first time and splits on it as a clock).

Exactness: both forms compute every feature from the same primitives in
float64 (integer sums, one shared EWMA recursion), so on the same history
they agree bit for bit (tests assert equality). The incremental form keeps a
ring of the last `ring` counts per row, running window sums and EWMA states:
O(rows) per step; max_w is read from the ring when features are asked for.
The spec itself (names, validation) is feature_spec.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.ndimage import maximum_filter1d

from speckv.services.predictor.serving.feature_spec import (
    NEVER,
    RATIO_EPS,
    SECONDS_PER_DAY,
    WHOLE_FRACTION,
    FeatureSpec,
)
from speckv.services.predictor.serving.trend import batch_trend_columns, rise_accel, rising, rising_counts, sum_spans


def _ewma_update(state: np.ndarray, counts: np.ndarray, a: float) -> np.ndarray:
    """The one EWMA recursion both forms use: a * state + (1 - a) * counts."""
    return a * state + (1.0 - a) * counts


def _corrected(state: np.ndarray, exposure: float) -> np.ndarray:
    return state / exposure if exposure > 0 else np.zeros_like(state)


def _std(sums: np.ndarray, sumsq: np.ndarray, w: int) -> np.ndarray:
    mean = sums / w
    return np.sqrt(np.maximum(sumsq / w - mean * mean, 0.0))


def _tod(spec: FeatureSpec, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    angle = (2.0 * np.pi / SECONDS_PER_DAY) * (((steps + 1) * spec.step_s + spec.tod_offset_s) % SECONDS_PER_DAY)
    return np.sin(angle), np.cos(angle)


def _since(spec: FeatureSpec, step: np.ndarray | int, last: np.ndarray) -> np.ndarray:
    return np.where(last == NEVER, spec.cap_s, np.minimum((step - last) * spec.step_s, spec.cap_s))


def batch_features(counts: np.ndarray, total: np.ndarray, spec: FeatureSpec, first_step: int = 0,
                   rising_by_span: np.ndarray | None = None) -> np.ndarray:
    """Features of every (row, step): float32 (rows, steps, features).
    counts: (rows, steps) arrivals of absolute steps first_step..; total:
    (steps,) the cluster-wide count; history starts at first_step;
    rising_by_span: trend.rising_counts over every family of the history
    (None: counted over these rows, right when they are every family)."""
    cols = _batch_columns(counts, total, spec, first_step, rising_by_span)
    out = np.empty((*cols[0].shape, len(cols)), dtype=np.float32)
    for i, col in enumerate(cols):
        out[:, :, i] = col
    return out


def batch_feature_rows(counts: np.ndarray, total: np.ndarray, spec: FeatureSpec, rows: np.ndarray,
                       steps: np.ndarray, first_step: int = 0, rising_by_span: np.ndarray | None = None) -> np.ndarray:
    """batch_features(...)[rows, steps] without the (rows, steps, features)
    array: each column is gathered as soon as it is computed (float32 (N,
    features), C order). A sparse family is tracked for a few hundred of a
    trace's thousands of steps, so this is most of the saving."""
    cols = _batch_columns(counts, total, spec, first_step, rising_by_span)
    out = np.empty((len(rows), len(cols)), dtype=np.float32)
    for i, col in enumerate(cols):
        out[:, i] = col[rows, steps]
    return out


def _batch_columns(counts: np.ndarray, total: np.ndarray, spec: FeatureSpec, first_step: int,
                   rising_by_span: np.ndarray | None) -> list[np.ndarray]:
    """Every feature as a (rows, steps) float64 array (or a broadcast view), in names() order."""
    counts = np.asarray(counts, dtype=np.float64)
    n, T = counts.shape
    cols: list[np.ndarray] = []
    for k in spec.lags:
        lagged = np.zeros_like(counts)
        lagged[:, k - 1:] = counts[:, :T - k + 1]
        cols.append(lagged)
    cs = np.concatenate([np.zeros((n, 1)), np.cumsum(counts, axis=1)], axis=1)
    cs2 = np.concatenate([np.zeros((n, 1)), np.cumsum(counts * counts, axis=1)], axis=1)
    idx = np.arange(T)

    def trailing(cum: np.ndarray, w: int) -> np.ndarray:
        return cum[:, idx + 1] - cum[:, np.maximum(idx + 1 - w, 0)]

    for w in spec.windows:
        sums, sumsq = trailing(cs, w), trailing(cs2, w)
        peak = maximum_filter1d(counts, w, axis=1, mode="constant", cval=0.0, origin=(w - 1) // 2)
        cols += [sums / w, peak, _std(sums, sumsq, w)]
    span = trailing(cs, spec.burst_span)
    halflives = (*spec.halflives_s, spec.long_halflife_s)
    ewmas = [np.empty((n, T)) for _ in halflives]
    cluster = [np.empty(T) for _ in spec.cluster_halflives_s]
    level_prev = np.empty((n, T))  # long level per second at s - 1
    e = [np.zeros(n) for _ in halflives]
    x = [0.0 for _ in halflives]
    ce = [np.zeros(1) for _ in spec.cluster_halflives_s]
    cx = [0.0 for _ in spec.cluster_halflives_s]
    decays = [spec.decay(h) for h in halflives]
    cdecays = [spec.decay(h) for h in spec.cluster_halflives_s]
    for t in range(T):
        level_prev[:, t] = _corrected(e[-1], x[-1]) / spec.step_s
        for i, a in enumerate(decays):
            e[i] = _ewma_update(e[i], counts[:, t], a)
            x[i] = float(_ewma_update(np.float64(x[i]), np.float64(1.0), a))
            ewmas[i][:, t] = _corrected(e[i], x[i])
        for i, a in enumerate(cdecays):
            ce[i] = _ewma_update(ce[i], total[t:t + 1].astype(np.float64), a)
            cx[i] = float(_ewma_update(np.float64(cx[i]), np.float64(1.0), a))
            cluster[i][t] = _corrected(ce[i], cx[i])[0]
    cols += ewmas[:-1]
    level = ewmas[-1] / spec.step_s
    cols.append(level)
    cols += [ew / (level * spec.step_s + RATIO_EPS) for ew in ewmas[:-1]]
    steps = first_step + idx
    burst = span > np.maximum(spec.burst_ratio * level_prev * spec.burst_span * spec.step_s, spec.min_burst_count)
    cols.append(_since(spec, steps[None, :], _last_true(burst, steps)))
    cols.append(_since(spec, steps[None, :], _last_true(counts > 0, steps)))
    cols.append(np.minimum(cs[:, 1:], spec.turn_cap))
    cols.append(np.broadcast_to(np.asarray(total, dtype=np.float64), (n, T)))
    cols += [np.broadcast_to(c, (n, T)) for c in cluster]
    if spec.trend_spans:
        if rising_by_span is None:
            rising_by_span = rising_counts([counts], spec.trend_spans, T)
        cols += batch_trend_columns(counts, total, rising_by_span, spec.trend_spans)
    if spec.time_of_day:
        sin, cos = _tod(spec, steps.astype(np.float64))
        cols += [np.broadcast_to(sin, (n, T)), np.broadcast_to(cos, (n, T))]
    return cols


def _last_true(mask: np.ndarray, steps: np.ndarray) -> np.ndarray:
    marked = np.where(mask, steps[None, :], NEVER)
    return np.maximum.accumulate(marked, axis=1)


@dataclass(slots=True)
class OnlineFeatures:
    """Incremental features for `capacity` rows (grows on demand). Call
    advance() once per completed step, in order; features() reads any rows."""

    spec: FeatureSpec
    capacity: int = 64
    next_step: int | None = None  # the step advance() expects next
    _ring: np.ndarray = field(init=False)
    _peak: np.ndarray = field(init=False)  # float32 (2 * max window, capacity): counts twice over, see _peaks
    _sums: np.ndarray = field(init=False)  # (windows + span, capacity)
    _sumsq: np.ndarray = field(init=False)
    _ewma: np.ndarray = field(init=False)  # (halflives + long, capacity)
    _exposure: list[float] = field(init=False)
    _cluster: list[float] = field(init=False)
    _cluster_exposure: list[float] = field(init=False)
    _cluster_last: float = field(init=False, default=0.0)
    _last_burst: np.ndarray = field(init=False)
    _last_arrival: np.ndarray = field(init=False)
    _turns: np.ndarray = field(init=False)
    # trend.py's state: trailing sums over sum_spans per row and for the cluster, the cluster's own
    # ring of totals, and the rising counts as of the last step
    _trend_sums: np.ndarray = field(init=False)  # (len(sum_spans), capacity)
    _cluster_ring: np.ndarray = field(init=False)  # (ring,)
    _cluster_sums: np.ndarray = field(init=False)  # (len(sum_spans),)
    _rising: np.ndarray = field(init=False)  # (len(trend_spans),)

    def __post_init__(self) -> None:
        self.spec.validate()
        nh = len(self.spec.halflives_s) + 1
        self._exposure = [0.0] * nh
        self._cluster = [0.0] * len(self.spec.cluster_halflives_s)
        self._cluster_exposure = [0.0] * len(self.spec.cluster_halflives_s)
        self._cluster_ring = np.zeros(self.spec.ring)
        self._cluster_sums = np.zeros(len(sum_spans(self.spec.trend_spans)))
        self._rising = np.zeros(len(self.spec.trend_spans))
        self._allocate(self.capacity)

    def _allocate(self, capacity: int) -> None:
        nw, nh, R = len(self.spec.windows) + 1, len(self.spec.halflives_s) + 1, self.spec.ring
        self.capacity = capacity
        self._ring = np.zeros((capacity, R))
        self._peak = np.zeros((2 * max(self.spec.windows), capacity), dtype=np.float32)
        self._sums, self._sumsq = np.zeros((nw, capacity)), np.zeros((nw, capacity))
        self._ewma = np.zeros((nh, capacity))
        self._last_burst = np.full(capacity, NEVER, dtype=np.int64)
        self._last_arrival = np.full(capacity, NEVER, dtype=np.int64)
        self._turns = np.zeros(capacity)
        self._trend_sums = np.zeros((len(sum_spans(self.spec.trend_spans)), capacity))

    def grow(self, capacity: int) -> None:
        """Makes room for `capacity` rows; new rows start with no history."""
        if capacity <= self.capacity:
            return
        old = (self._ring, self._sums, self._sumsq, self._ewma, self._last_burst, self._last_arrival, self._turns)
        peak, trend, n = self._peak, self._trend_sums, self.capacity
        self._allocate(capacity)
        self._peak[:, :n] = peak
        self._ring[:n], self._sums[:, :n], self._sumsq[:, :n], self._ewma[:, :n] = old[0], old[1], old[2], old[3]
        self._last_burst[:n], self._last_arrival[:n], self._turns[:n] = old[4], old[5], old[6]
        self._trend_sums[:, :n] = trend

    def reset_rows(self, rows: np.ndarray) -> None:
        """Forgets rows' history (a row handed to a new family)."""
        self._ring[rows] = 0.0
        self._peak[:, rows] = 0.0
        self._sums[:, rows] = self._sumsq[:, rows] = self._ewma[:, rows] = 0.0
        self._last_burst[rows] = self._last_arrival[rows] = NEVER
        self._turns[rows] = 0.0
        self._trend_sums[:, rows] = 0.0

    def advance(self, step: int, counts: np.ndarray, total: float) -> None:
        """Takes in completed step `step` (counts per row, float, capacity
        long; total: the cluster count). Steps must come in order from the
        first one (the history's origin)."""
        spec = self.spec
        if self.next_step is not None and step != self.next_step:
            raise ValueError(f"step {step}: expected step {self.next_step}")
        counts = np.asarray(counts, dtype=np.float64)
        level_prev = _corrected(self._ewma[-1], self._exposure[-1]) / spec.step_s
        col, R = step % spec.ring, spec.ring
        for i, w in enumerate((*spec.windows, spec.burst_span)):
            old = self._ring[:, (step - w) % R] if w < R else self._ring[:, col]
            self._sums[i] += counts - old
            self._sumsq[i] += counts * counts - old * old
        self._advance_trend(step, counts, float(total))
        self._ring[:, col] = counts
        W = max(spec.windows)
        self._peak[step % W] = self._peak[step % W + W] = counts  # exact: counts are small integers
        for i, h in enumerate((*spec.halflives_s, spec.long_halflife_s)):
            a = spec.decay(h)
            self._ewma[i] = _ewma_update(self._ewma[i], counts, a)
            self._exposure[i] = float(_ewma_update(np.float64(self._exposure[i]), np.float64(1.0), a))
        for i, h in enumerate(spec.cluster_halflives_s):
            a = spec.decay(h)
            self._cluster[i] = float(_ewma_update(np.array([self._cluster[i]]), np.array([float(total)]), a)[0])
            self._cluster_exposure[i] = float(_ewma_update(np.float64(self._cluster_exposure[i]), np.float64(1.0), a))
        threshold = np.maximum(spec.burst_ratio * level_prev * spec.burst_span * spec.step_s, spec.min_burst_count)
        self._last_burst[self._sums[-1] > threshold] = step
        self._last_arrival[counts > 0] = step
        self._turns = self._turns + counts
        self._cluster_last = float(total)
        self.next_step = step + 1

    def _advance_trend(self, step: int, counts: np.ndarray, total: float) -> None:
        """Moves the trend sums on by step `step` (before the ring holds it)
        and counts the rows rising as of it."""
        spans = self.spec.trend_spans
        if not spans:
            return
        R = self.spec.ring
        for i, w in enumerate(sum_spans(spans)):
            self._trend_sums[i] += counts - self._ring[:, (step - w) % R]
            self._cluster_sums[i] += total - self._cluster_ring[(step - w) % R]
        self._cluster_ring[step % R] = total
        for j in range(len(spans)):
            self._rising[j] = np.count_nonzero(rising(self._trend_sums[3 * j], self._trend_sums[3 * j + 1]))

    def _trend_columns(self, get, n: int) -> list[np.ndarray]:
        """The trend columns (trend.trend_names order) of the rows `get` reads."""
        cols: list[np.ndarray] = []
        for j, w in enumerate(self.spec.trend_spans):
            cols += list(rise_accel(*(get(self._trend_sums[3 * j + m]) for m in range(3)), w))
            whole = rise_accel(*(self._cluster_sums[3 * j + m:3 * j + m + 1] for m in range(3)), w)
            cols += [np.full(n, c[0]) for c in whole]
            cols.append(np.full(n, self._rising[j]))
        return cols

    def _peaks(self, r: np.ndarray, known: np.ndarray, step: int) -> dict[int, np.ndarray]:
        """max_w for each window. _peak holds each step at rows step % W and
        step % W + W (one row of every family's counts per step), so the last
        w steps are one contiguous slice of rows ending at step % W + W;
        windows nest, so each reads only the steps the shorter one did not
        (W rows in all). When the rows asked are at least WHOLE_FRACTION of
        the capacity (a forecast of many families), every family's maximum is
        taken over whole rows (contiguous, elementwise) and the rows asked
        picked after: a scattered gather costs far more per element than a
        contiguous pass. Else the asked columns are gathered first. Max is
        exact, so both ways give the same bits."""
        W = max(self.spec.windows)
        end = step % W + W + 1
        out: dict[int, np.ndarray] = {}
        whole = len(r) >= WHOLE_FRACTION * self.capacity
        best = np.zeros(self.capacity if whole else len(r), dtype=np.float32)
        done = 0
        for w in sorted(set(self.spec.windows)):
            block = self._peak[end - w:end - done]
            best = np.maximum(best, (block if whole else block[:, r]).max(axis=0))
            out[w] = np.where(known, best[r] if whole else best, 0.0)
            done = w
        return out

    def features(self, rows: np.ndarray) -> np.ndarray:
        """float32 (len(rows), features) as of the end of step next_step - 1;
        a row of -1 reads as a family with no history (the prior)."""
        spec = self.spec
        rows = np.asarray(rows, dtype=np.int64)
        known = rows >= 0
        r = np.where(known, rows, 0)
        step = (self.next_step or 0) - 1
        R = spec.ring

        def get(values: np.ndarray, fill: float | int = 0.0) -> np.ndarray:
            return np.where(known, values[r], fill)

        cols: list[np.ndarray] = []
        for k in spec.lags:
            cols.append(get(self._ring[:, (step - k + 1) % R]))
        peaks = self._peaks(r, known, step)
        for i, w in enumerate(spec.windows):
            sums, sumsq = get(self._sums[i]), get(self._sumsq[i])
            cols += [sums / w, peaks[w], _std(sums, sumsq, w)]
        ewmas = [_corrected(get(self._ewma[i]), x) for i, x in enumerate(self._exposure)]
        cols += ewmas[:-1]
        level = ewmas[-1] / spec.step_s
        cols.append(level)
        cols += [ew / (level * spec.step_s + RATIO_EPS) for ew in ewmas[:-1]]
        cols.append(_since(spec, step, get(self._last_burst, NEVER)))
        cols.append(_since(spec, step, get(self._last_arrival, NEVER)))
        cols.append(np.minimum(get(self._turns), spec.turn_cap))
        n = len(rows)
        cols.append(np.full(n, self._cluster_last))
        cols += [np.full(n, _corrected(np.array([c]), x)[0]) for c, x in zip(self._cluster, self._cluster_exposure)]
        cols += self._trend_columns(get, n)
        if spec.time_of_day:
            sin, cos = _tod(spec, np.full(n, float(step)))
            cols += [sin, cos]
        out = np.empty((n, len(cols)), dtype=np.float32)  # C order: LightGBM reads it without a copy
        for i, col in enumerate(cols):
            out[:, i] = col
        return out
