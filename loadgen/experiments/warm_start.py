"""Which KV a warm start leaves resident, shared by the live warm start
(bench/e2e/warm.py, over gRPC) and the simulator's (sim/simulation.py): the
newest requests before the slice, as many as their distinct full blocks fit."""
from __future__ import annotations

from typing import Sequence

from speckv.services.common.traces import TraceRequest


def resident_tail(requests: Sequence[TraceRequest], max_blocks: int) -> int:
    """Index of the first request of the newest suffix whose distinct full
    blocks number at most max_blocks."""
    seen: set[int] = set()
    for i in range(len(requests) - 1, -1, -1):
        r = requests[i]
        seen.update(r.block_hashes[:r.full_blocks])
        if len(seen) > max_blocks:
            return i + 1
    return 0
