"""Fitting the engine cost model to timed batches: pure numerics, no I/O.

Prefill (one forward pass over n new tokens with nothing cached, attention
kernels apart), in ms:
    t(n) = intercept_ms + slope_ms * n
fitted by least squares on the relative error (each point weighted 1 / t, so
a 512-token batch counts as much as a 16k-token one) over batch sizes in
[min_tokens, max_tokens]. The causal attention pair term is not fitted here:
`attention_pair_ms` derives it from a published kernel throughput.

Decode step (b sequences, one new token each, the reads of their KV apart):
    t(b) = intercept_ms + slope_ms * b
the same fit over b in [1, max_batch].

Held out: the batch sizes in range, sorted, alternate between the fit and the
held-out half (fit the 1st, 3rd, ...; report the 2nd, 4th, ...), so the
held-out sizes interleave the fitted ones over the whole range. The error of
a size is |predicted - actual| / actual.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speckv.services.common.errors import InvalidArgument

# Floating-point operations per (query, key) pair per attention head and head
# dimension: Q.K^T and P.V, one multiply-add (2 FLOPs) each per element.
# FlashAttention counts FLOPs the same way (4 * seqlen^2 * head_dim * heads,
# halved with a causal mask), so its published throughputs divide it directly.
FLOPS_PER_PAIR_PER_HEAD_DIM = 4.0


@dataclass(frozen=True, slots=True)
class LinearFit:
    """t(x) = intercept_ms + slope_ms * x, ms; x in tokens or sequences."""

    intercept_ms: float
    slope_ms: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.intercept_ms + self.slope_ms * np.asarray(x, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class FitError:
    """Relative error of a fit on the held-out sizes in [low, high]: `count`
    sizes, their mean, 90th percentile and maximum (fractions, 0.05 = 5 %),
    and the size where it is largest."""

    low: int
    high: int
    count: int
    mean: float
    p90: float
    max: float
    worst: int

    def to_json(self) -> dict[str, float | int]:
        return {"low": self.low, "high": self.high, "count": self.count, "mean": round(self.mean, 4),
                "p90": round(self.p90, 4), "max": round(self.max, 4), "worst": self.worst}


@dataclass(frozen=True, slots=True)
class HeldOutFit:
    """A linear fit on one half of the sizes and its error on the other half.
    fit_sizes and held_out_sizes are disjoint and interleave; `error` is over
    the held-out sizes in the reporting range, `bands` over sub-ranges of it."""

    fit: LinearFit
    fit_sizes: np.ndarray
    held_out_sizes: np.ndarray
    error: FitError
    bands: tuple[FitError, ...]


def alternate_split(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices into `sizes` (ascending, unique) of the fit half (even
    positions) and the held-out half (odd positions)."""
    positions = np.arange(len(sizes))
    return positions[positions % 2 == 0], positions[positions % 2 == 1]


def fit_linear(x: np.ndarray, t_ms: np.ndarray) -> LinearFit:
    """Least squares on relative error: minimises sum(((a + b x - t) / t)^2).
    Needs two distinct x and every t > 0."""
    x = np.asarray(x, dtype=np.float64)
    t_ms = np.asarray(t_ms, dtype=np.float64)
    if len(x) != len(t_ms) or len(np.unique(x)) < 2:
        raise InvalidArgument(f"a linear fit needs at least two distinct sizes (got {len(np.unique(x))})")
    if np.any(t_ms <= 0):
        raise InvalidArgument("a linear fit on relative error needs every time > 0")
    design = np.column_stack([np.ones_like(x), x]) / t_ms[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, np.ones_like(x), rcond=None)
    return LinearFit(float(intercept), float(slope))


def relative_error(fit: LinearFit, x: np.ndarray, t_ms: np.ndarray, low: int, high: int) -> FitError | None:
    """The fit's error on the points with low <= x <= high; None when none is."""
    x = np.asarray(x, dtype=np.float64)
    t_ms = np.asarray(t_ms, dtype=np.float64)
    inside = (x >= low) & (x <= high)
    if not np.any(inside):
        return None
    errors = np.abs(fit.predict(x[inside]) - t_ms[inside]) / t_ms[inside]
    worst = int(np.argmax(errors))
    return FitError(low, high, int(inside.sum()), float(errors.mean()), float(np.percentile(errors, 90)),
                    float(errors[worst]), int(x[inside][worst]))


def fit_held_out(sizes: np.ndarray, t_ms: np.ndarray, fit_range: tuple[int, int],
                 report_range: tuple[int, int], bands: tuple[tuple[int, int], ...] = ()) -> HeldOutFit:
    """Fits t = a + b x on alternate sizes within fit_range and reports the
    error on the others within report_range (and each band of it that holds
    a held-out size). sizes ascending and unique, t_ms aligned with them."""
    sizes = np.asarray(sizes)
    t_ms = np.asarray(t_ms, dtype=np.float64)
    if len(sizes) != len(t_ms) or np.any(np.diff(sizes) <= 0):
        raise InvalidArgument("sizes must be ascending and unique, one time each")
    in_range = (sizes >= fit_range[0]) & (sizes <= fit_range[1])
    x, t = sizes[in_range], t_ms[in_range]
    if len(x) < 4:
        raise InvalidArgument(f"only {len(x)} batch sizes in [{fit_range[0]}, {fit_range[1]}]: "
                              "a held-out fit needs at least 4")
    fit_index, held_index = alternate_split(x)
    fit = fit_linear(x[fit_index], t[fit_index])
    error = relative_error(fit, x[held_index], t[held_index], *report_range)
    if error is None:
        raise InvalidArgument(f"no held-out batch size in [{report_range[0]}, {report_range[1]}]")
    found = (relative_error(fit, x[held_index], t[held_index], low, high) for low, high in bands)
    return HeldOutFit(fit, x[fit_index], x[held_index], error, tuple(e for e in found if e is not None))


def attention_pair_ms(num_layers: int, num_heads: int, head_dim: int, tflops: float, gpus: int = 1) -> float:
    """Causal attention's cost per (query, key) pair for the whole model, ms,
    at a kernel throughput of `tflops` (10^12 FLOP/s per GPU) on each of
    `gpus` GPUs sharing the heads (tensor parallelism). Grouped-query
    attention costs the same per query head as multi-head attention."""
    if min(num_layers, num_heads, head_dim, gpus) <= 0 or tflops <= 0:
        raise InvalidArgument("attention_pair_ms needs positive layers, heads, head_dim, gpus and tflops")
    flops = FLOPS_PER_PAIR_PER_HEAD_DIM * num_heads * head_dim * num_layers
    return flops / (tflops * 1e12 * gpus) * 1e3


@dataclass(frozen=True, slots=True)
class PrefillFit:
    """prefill_ms(n) = overhead_ms + ms_per_token * n + ms_per_token_pair * n (n + 1) / 2
    for n new tokens and nothing cached: the engine profile's form
    (services/config/engine_profiles.json), its pair term fitted too (an
    engine whose attention is not negligible, e.g. vLLM on CPU)."""

    overhead_ms: float
    ms_per_token: float
    ms_per_token_pair: float

    def predict(self, n: np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=np.float64)
        return self.overhead_ms + self.ms_per_token * n + self.ms_per_token_pair * n * (n + 1) / 2


def fit_prefill(n: np.ndarray, t_ms: np.ndarray) -> PrefillFit:
    """Least squares on relative error over (1, n, n(n+1)/2); needs three
    distinct sizes and every t > 0. Coefficients are not constrained: a
    negative one says the form does not describe the engine there."""
    n = np.asarray(n, dtype=np.float64)
    t_ms = np.asarray(t_ms, dtype=np.float64)
    if len(n) != len(t_ms) or len(np.unique(n)) < 3:
        raise InvalidArgument(f"a prefill fit needs at least three distinct sizes (got {len(np.unique(n))})")
    if np.any(t_ms <= 0):
        raise InvalidArgument("a prefill fit on relative error needs every time > 0")
    design = np.column_stack([np.ones_like(n), n, n * (n + 1) / 2]) / t_ms[:, None]
    (overhead, per_token, pair), *_ = np.linalg.lstsq(design, np.ones_like(n), rcond=None)
    return PrefillFit(float(overhead), float(per_token), float(pair))


def prefill_held_out(sizes: np.ndarray, t_ms: np.ndarray) -> tuple[PrefillFit, FitError]:
    """fit_prefill on alternate sizes (ascending, unique), its relative
    error on the others (alternate_split)."""
    sizes = np.asarray(sizes)
    t_ms = np.asarray(t_ms, dtype=np.float64)
    if len(sizes) != len(t_ms) or np.any(np.diff(sizes) <= 0) or len(sizes) < 6:
        raise InvalidArgument("a held-out prefill fit needs >= 6 ascending unique sizes, one time each")
    fit_index, held_index = alternate_split(sizes)
    fit = fit_prefill(sizes[fit_index], t_ms[fit_index])
    held, actual = sizes[held_index].astype(np.float64), t_ms[held_index]
    errors = np.abs(fit.predict(held) - actual) / actual
    worst = int(np.argmax(errors))
    error = FitError(int(held.min()), int(held.max()), len(held), float(errors.mean()),
                     float(np.percentile(errors, 90)), float(errors[worst]), int(held[worst]))
    return fit, error
