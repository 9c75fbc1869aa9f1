"""Workloads at scale: a real trace replayed whole, merged with time-shifted
copies of itself for more nodes than it can load, and two synthetic bursty
generators (in addition to the real traces, never instead).

Scaling a trace to N nodes (`ScaledTrace`): the live configuration sizes
the trace for `base_nodes` nodes (services/config/e2e.json, 4 for the
Mooncake conversation trace), so N nodes get copies = ceil(N / base_nodes)
copies. Copy k (k = 0 is the trace itself) has every block hash offset by
k * (max hash + 1) and its family prefixed "c<k>:", so copies share no block
and no family; its arrival times are rotated by k * span / copies within the
trace's span [first, last arrival] (a time that passes the end wraps to the
start), so the merged trace covers the same hour at copies x the rate and
the copies' bursts do not line up.

Every simulated block hash also carries HASH_BASE = 2**62, so hashes sit
where real ones do: engines publish 64-bit digests (uint64 in the protos),
three in four of them at 2**62 or more, while the traces number their
blocks 0, 1, 2, ... Hashes are only ever compared for equality, so results
do not change (tests/unit/test_sim_workload.py runs a slice both ways). It
matters for speed: compiled code keeps an int below 2**62 unboxed and makes
a new Python int each time it passes one to a dict or set, which the store
and index paths do for every block of every prompt; a larger int is passed
by reference. Measured on a compiled 24-block touch loop: 186 ns against
85 ns per block.

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

import math
from dataclasses import asdict, dataclass
from collections import Counter
from typing import Sequence

import numpy as np

from speckv.loadgen.traces import TraceRequest
from speckv.services.scheduler.ids import UINT64_MAX, Family


HASH_BASE = 1 << 62  # added to every simulated block hash (module docstring)


def copy_family(copy: int, family: str) -> str:
    """Copy k's name for a family of the base trace (the trace's own for k = 0)."""
    return f"c{copy}:{family}" if copy else family


def hash_base(stride: int, copies: int) -> int:
    """What copy 0's hashes are offset by: HASH_BASE while every copy's
    hashes (below HASH_BASE + copies x stride) stay uint64, else 0 (a trace
    that already has 64-bit hashes). ValueError when even the copies overflow."""
    top = copies * stride - 1
    if top > UINT64_MAX:
        raise ValueError(f"{copies} copies of hashes up to {stride - 1} exceed uint64: "
                         "scale the trace to fewer nodes")
    return HASH_BASE if HASH_BASE + top <= UINT64_MAX else 0


def copies_for(nodes: int, base_nodes: int) -> int:
    return max(1, math.ceil(nodes / max(1, base_nodes)))


class ScaledTrace(Sequence[TraceRequest]):
    """The trace merged with copies - 1 disjoint, time-rotated copies (see
    the module docstring), in arrival order. Lazy: request i is built when
    read, so 256 copies of a 12k-request trace cost arrays, not 3 M records.
    Also a FutureArrivals (the oracle's truth) over the merged arrivals."""

    def __init__(self, trace: Sequence[TraceRequest], copies: int) -> None:
        base = sorted(trace, key=lambda r: r.arrival_s)
        self._base, self.copies = base, max(1, copies)
        times = np.array([r.arrival_s for r in base], dtype=np.float64)
        first = float(times.min()) if len(times) else 0.0
        span = (float(times.max()) - first + 1e-3) if len(times) else 1.0
        self._stride = max((h for r in base for h in r.block_hashes), default=0) + 1
        self._hash_base = hash_base(self._stride, self.copies)
        k = np.repeat(np.arange(self.copies), len(base))
        all_times = first + (np.tile(times - first, self.copies) + k * span / self.copies) % span
        order = np.argsort(all_times, kind="stable")
        self.times = all_times[order]
        self._copy = k[order].astype(np.int32)
        self._index = np.tile(np.arange(len(base)), self.copies)[order].astype(np.int32)

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        r, k = self._base[self._index[i]], int(self._copy[i])
        offset = self._hash_base + k * self._stride
        return TraceRequest(float(self.times[i]), r.prompt_tokens, r.output_tokens,
                            tuple([h + offset for h in r.block_hashes]), r.block_tokens, copy_family(k, r.family))

    @property
    def base(self) -> list[TraceRequest]:
        """The trace itself, in arrival order (copy 0)."""
        return self._base

    def base_rows(self, lo: int, hi: int) -> np.ndarray:
        """For requests lo..hi-1, the row in `base` each is a copy of."""
        return self._index[lo:hi]

    def family_of(self, i: int) -> str:
        return copy_family(int(self._copy[i]), self._base[self._index[i]].family)

    def window(self, start_s: float, end_s: float) -> tuple[int, int]:
        """Index range of arrivals in [start_s, end_s)."""
        return (int(np.searchsorted(self.times, start_s, "left")), int(np.searchsorted(self.times, end_s, "left")))

    def counts(self, start: float, end: float) -> dict[Family, int]:
        """FutureArrivals: true arrivals per family in (start, end]. The
        oracle asks every tick for the next seconds, so each arrival is read
        several times: counted by (copy, base family) first, each family's
        name formatted once."""
        lo = int(np.searchsorted(self.times, start, "right"))
        hi = int(np.searchsorted(self.times, end, "right"))
        base = self._base
        by_copy = Counter(zip(self._copy[lo:hi].tolist(), [base[r].family for r in self._index[lo:hi].tolist()]))
        return {Family(copy_family(k, family)): n for (k, family), n in by_copy.items()}


class SliceView(Sequence[TraceRequest]):
    """Requests [lo, hi) of a sequence, without copying it."""

    def __init__(self, source: Sequence[TraceRequest], lo: int, hi: int) -> None:
        self._source, self._lo, self._hi = source, lo, max(lo, hi)

    def __len__(self) -> int:
        return self._hi - self._lo

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._source[self._lo + i]


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
