"""Synthetic bursty workloads, in addition to the real traces, never instead.

Synthetic families (both generators): F families with Zipf(s) popularity;
family f's prompt is a shared prefix of `prefix_blocks` blocks (its chain)
plus `suffix_blocks` (uniform 1..max) blocks of its own, block_tokens per
block; output tokens uniform in [lo, hi]. All draws come from one seeded
NumPy Generator, so a seed gives one workload.
- Markov-modulated Poisson (`mmpp`): a two-state chain, calm and burst,
  with exponential sojourns (means calm_s, burst_s); arrivals are Poisson at
  rate_calm or rate_burst per second; in the burst state a fraction
  burst_focus of arrivals go to one family drawn when the burst starts.
- Hawkes (`hawkes`): immigrants arrive as Poisson(mu) with a Zipf family;
  every arrival begets Poisson(branching) children at exponential delays of
  mean 1/decay seconds in its own family (self-excitation of one family =
  a family burst). branching < 1 keeps it stationary: mean rate mu / (1 - branching).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from speckv.services.common.traces import TraceRequest


@dataclass(frozen=True, slots=True)
class FamilyShape:
    families: int = 200
    zipf_s: float = 1.1
    prefix_blocks: int = 8
    max_suffix_blocks: int = 4
    block_tokens: int = 512
    output_tokens: tuple[int, int] = (50, 400)

    def __post_init__(self) -> None:
        if min(self.families, self.prefix_blocks, self.max_suffix_blocks) < 1 or self.block_tokens < 2:
            raise ValueError(f"{self}: families, prefix_blocks and max_suffix_blocks must be >= 1, block_tokens >= 2")
        if self.zipf_s < 0 or not 1 <= self.output_tokens[0] <= self.output_tokens[1]:
            raise ValueError(f"{self}: zipf_s must be >= 0 and output_tokens (lo, hi) with 1 <= lo <= hi")


@dataclass(frozen=True, slots=True)
class MmppParams:
    duration_s: float = 3600.0
    rate_calm: float = 3.0
    rate_burst: float = 15.0
    calm_s: float = 60.0
    burst_s: float = 8.0
    burst_focus: float = 0.8
    seed: int = 7

    def __post_init__(self) -> None:
        if not (self.duration_s > 0 and self.calm_s > 0 and self.burst_s > 0):
            raise ValueError(f"{self}: duration_s, calm_s and burst_s must be > 0")
        if not (self.rate_calm >= 0 and self.rate_burst >= 0 and 0.0 <= self.burst_focus <= 1.0):
            raise ValueError(f"{self}: rates must be >= 0 and burst_focus in [0, 1]")


@dataclass(frozen=True, slots=True)
class HawkesParams:
    duration_s: float = 3600.0
    mu: float = 1.5
    branching: float = 0.5
    decay: float = 1.0  # per second: children follow their parent by ~1 s
    seed: int = 7

    def __post_init__(self) -> None:
        if not (self.duration_s > 0 and self.mu > 0 and self.decay > 0):
            raise ValueError(f"{self}: duration_s, mu and decay must be > 0")
        if not 0.0 <= self.branching < 1.0:
            # At branching >= 1 each arrival begets one or more on average: the
            # cascade never dies out and generating it would not end.
            raise ValueError(f"{self}: branching must be in [0, 1) for a stationary process")


def describe(params: MmppParams | HawkesParams, shape: FamilyShape) -> dict[str, object]:
    """Parameters for the report."""
    return {"generator": type(params).__name__, **asdict(params), "families": asdict(shape)}


class _Families:
    def __init__(self, shape: FamilyShape, rng: np.random.Generator) -> None:
        self.shape, self._rng = shape, rng
        weights = 1.0 / np.arange(1, shape.families + 1) ** shape.zipf_s
        self.p = weights / weights.sum()
        self._next_hash = shape.families * shape.prefix_blocks + 1

    def pick(self) -> int:
        return int(self._rng.choice(self.shape.families, p=self.p))

    def request(self, t: float, family: int) -> TraceRequest:
        s = self.shape
        prefix = tuple(range(family * s.prefix_blocks + 1, (family + 1) * s.prefix_blocks + 1))
        suffix_n = int(self._rng.integers(1, s.max_suffix_blocks + 1))
        suffix = tuple(range(self._next_hash, self._next_hash + suffix_n))
        self._next_hash += suffix_n
        tail = int(self._rng.integers(1, s.block_tokens))  # a partial last block
        prompt = (s.prefix_blocks + suffix_n) * s.block_tokens + tail
        out = int(self._rng.integers(s.output_tokens[0], s.output_tokens[1] + 1))
        return TraceRequest(t, prompt, out, prefix + suffix, s.block_tokens, f"syn-{family}")


def mmpp(params: MmppParams, shape: FamilyShape = FamilyShape()) -> list[TraceRequest]:
    rng = np.random.default_rng(params.seed)
    fam = _Families(shape, rng)
    out: list[TraceRequest] = []
    t, burst = 0.0, False
    while t < params.duration_s:
        end = min(params.duration_s, t + rng.exponential(params.burst_s if burst else params.calm_s))
        rate = params.rate_burst if burst else params.rate_calm
        hot = fam.pick()
        n = rng.poisson(rate * (end - t))
        for a in np.sort(rng.uniform(t, end, n)):
            family = hot if burst and rng.random() < params.burst_focus else fam.pick()
            out.append(fam.request(float(a), family))
        t, burst = end, not burst
    return out


def hawkes(params: HawkesParams, shape: FamilyShape = FamilyShape()) -> list[TraceRequest]:
    """Cluster (branching) construction of a Hawkes process, marked by family."""
    rng = np.random.default_rng(params.seed)
    fam = _Families(shape, rng)
    n0 = rng.poisson(params.mu * params.duration_s)
    pending = [(float(t), fam.pick()) for t in rng.uniform(0, params.duration_s, n0)]
    events: list[tuple[float, int]] = []
    while pending:
        t, f = pending.pop()
        events.append((t, f))
        for _ in range(rng.poisson(params.branching)):
            child = t + rng.exponential(1.0 / params.decay)
            if child < params.duration_s:
                pending.append((child, f))
    events.sort()
    return [fam.request(t, f) for t, f in events]
