"""The TTFT floor: what no placement or replication policy can beat.

For each request of a trace, in arrival order, the floor assumes an
unbounded cache on an idle node: every full block any earlier request of the
trace computed is still there, so the request reuses the longest such
leading run of its block chain (`reusable_blocks`) and prefills only the
rest, at once, with no queue, no transfer and no other work in the step.
floor_ms = profile.prefill_ms(P - cached, cached) with
cached = min(reusable_blocks x block_tokens, P - 1) (the last prompt token is
always computed, as in the engine).

Fixed from the trace and the engine profile alone, never from a run, and the
same for every policy: it is the ceiling a report sets beside the policies,
as the data-plane benchmarks set memcpy beside their copies. A policy's
excess over it comes from queueing, from KV the cluster computed but lost to
eviction, and from KV that sits on a node the request was not served on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from speckv.loadgen.experiments.metrics import percentile, request_key
from speckv.loadgen.experiments.results import FloorSummary
from speckv.services.common.engine_profile import EngineProfile
from speckv.services.common.traces.records import TraceRequest


def reusable_blocks(requests: Sequence[TraceRequest]) -> np.ndarray:
    """Per request (given in arrival order): leading full blocks of its chain
    that some earlier request computed (block ids are content-addressed
    chain hashes, so a matching id means a matching prefix)."""
    seen: set[int] = set()
    out = np.zeros(len(requests), dtype=np.int64)
    for i, r in enumerate(requests):
        chain = r.block_hashes[:r.full_blocks]
        n = 0
        for h in chain:
            if h not in seen:
                break
            n += 1
        out[i] = n
        seen.update(chain)
    return out


def reusable_tokens(requests: Sequence[TraceRequest], reusable: np.ndarray) -> np.ndarray:
    """Per request: tokens its reusable blocks cover, short of the last prompt token."""
    return np.array([min(int(b) * r.block_tokens, max(r.prompt_tokens - 1, 0)) for b, r in zip(reusable, requests)],
                    dtype=np.int64)


def floor_ttft_ms(requests: Sequence[TraceRequest], reusable: np.ndarray, profile: EngineProfile) -> np.ndarray:
    """Per request: prefill time alone on an idle node with its reusable prefix cached (ms)."""
    cached = reusable_tokens(requests, reusable).tolist()
    return np.array([profile.prefill_ms(r.prompt_tokens - c, c) for r, c in zip(requests, cached)], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class SliceFloor:
    """The floor of the requests a run replays (its slice), in replay order."""

    floor_ms: np.ndarray
    reusable_tokens: np.ndarray

    def rows(self, index: np.ndarray) -> "SliceFloor":
        """The floor of the requests at these rows, in that order."""
        return SliceFloor(self.floor_ms[index], self.reusable_tokens[index])

    def by_request_key(self) -> dict[str, int]:
        """Reusable tokens keyed as the replay keys its records (metrics.request_key)."""
        return {request_key(i): int(t) for i, t in enumerate(self.reusable_tokens.tolist())}


def slice_floor(history: Sequence[TraceRequest], replayed: Sequence[TraceRequest],
                profile: EngineProfile) -> SliceFloor:
    """Reuse counted over history (the trace before the slice) and the
    replayed requests before each."""
    both = [*history, *replayed]
    blocks = reusable_blocks(both)[len(history):]
    return SliceFloor(floor_ttft_ms(replayed, blocks, profile), reusable_tokens(replayed, blocks))


def floor_summary(floor_ms: np.ndarray, arrivals_s: Sequence[float], bursts: frozenset[int]) -> FloorSummary:
    """The floor's percentiles, under a policy summary's names."""
    burst = [ms for ms, t in zip(floor_ms.tolist(), arrivals_s) if math.floor(t) in bursts]
    return FloorSummary(percentile(floor_ms.tolist(), 50), percentile(floor_ms.tolist(), 90),
                        percentile(floor_ms.tolist(), 99), percentile(burst, 99))
