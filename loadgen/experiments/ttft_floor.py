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


def shared_prefix_blocks(requests: Sequence[TraceRequest]) -> int:
    """Full blocks every request's chain starts with (a system prompt all
    requests carry): reuse of them says nothing about placement, so the
    returning/first-seen split and the reuse ratios leave them out."""
    if not requests:
        return 0
    common = list(requests[0].block_hashes[:requests[0].full_blocks])
    for r in requests[1:]:
        chain = r.block_hashes[:r.full_blocks]
        n = 0
        while n < len(common) and n < len(chain) and common[n] == chain[n]:
            n += 1
        del common[n:]
        if not common:
            break
    return len(common)


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
    shared_tokens: np.ndarray  # of the reusable tokens, those of the prefix every request shares

    @property
    def returning(self) -> np.ndarray:
        """Per request: whether it reuses more than the shared prefix (KV the
        cluster computed before for it, beyond what every request has)."""
        return self.reusable_tokens > self.shared_tokens

    def rows(self, index: np.ndarray) -> "SliceFloor":
        """The floor of the requests at these rows, in that order."""
        return SliceFloor(self.floor_ms[index], self.reusable_tokens[index], self.shared_tokens[index])

    def by_request_key(self) -> dict[str, int]:
        """Reusable tokens keyed as the replay keys its records (metrics.request_key)."""
        return _keyed(self.reusable_tokens)

    def shared_by_request_key(self) -> dict[str, int]:
        """Shared-prefix tokens, keyed like by_request_key."""
        return _keyed(self.shared_tokens)


def _keyed(tokens: np.ndarray) -> dict[str, int]:
    return {request_key(i): int(t) for i, t in enumerate(tokens.tolist())}


def slice_floor(history: Sequence[TraceRequest], replayed: Sequence[TraceRequest],
                profile: EngineProfile) -> SliceFloor:
    """Reuse counted over history (the trace before the slice) and the
    replayed requests before each."""
    both = [*history, *replayed]
    blocks = reusable_blocks(both)[len(history):]
    shared = np.minimum(blocks, shared_prefix_blocks(both))
    return SliceFloor(floor_ttft_ms(replayed, blocks, profile), reusable_tokens(replayed, blocks),
                      reusable_tokens(replayed, shared))


def floor_summary(floor_ms: np.ndarray, arrivals_s: Sequence[float], bursts: frozenset[int],
                  returning: np.ndarray | None = None) -> FloorSummary:
    """The floor's percentiles, under a policy summary's names; returning
    (SliceFloor.returning) adds the returning requests' p99."""
    burst = [ms for ms, t in zip(floor_ms.tolist(), arrivals_s) if math.floor(t) in bursts]
    back = floor_ms[returning].tolist() if returning is not None else []
    return FloorSummary(percentile(floor_ms.tolist(), 50), percentile(floor_ms.tolist(), 90),
                        percentile(floor_ms.tolist(), 99), percentile(burst, 99),
                        percentile(back, 99) if returning is not None else None)
