"""The TTFT floor (loadgen/experiments/ttft_floor.py) and the burst breakdown it feeds."""
from __future__ import annotations

import numpy as np
import pytest

from speckv.loadgen.experiments.metrics import RequestRecord, summarize
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger
from speckv.loadgen.experiments.ttft_floor import (
    floor_summary,
    floor_ttft_ms,
    reusable_blocks,
    shared_prefix_blocks,
    slice_floor,
)
from speckv.services.common.engine_profile import EngineProfile
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.traces.records import TraceRequest

# prefill_ms(new, cached) = 10 + 1 * new + 0.001 * (new * cached + new * (new + 1) / 2)
PROFILE = EngineProfile("t", "m", "h", overhead_ms=10.0, ms_per_token=1.0, ms_per_token_pair=0.001,
                        geometry=KVGeometry(1, 1, 1, "float16", 4))


def _req(t: float, prompt: int, hashes: tuple[int, ...], family: str = "f") -> TraceRequest:
    return TraceRequest(t, prompt, 1, hashes, 4, family)


def test_reuse_counts_only_the_leading_run_of_blocks_seen_before():
    requests = [_req(0.0, 8, (1, 2)),
                _req(1.0, 16, (1, 2, 3, 4)),  # 1, 2 computed before
                _req(2.0, 12, (1, 9, 3)),  # 1 yes, 9 no: 3 does not count after the gap
                _req(3.0, 4, (7,)),  # nothing
                _req(4.0, 16, (1, 2, 3, 4))]  # all four, computed by request 1
    assert reusable_blocks(requests).tolist() == [0, 2, 1, 0, 4]


@pytest.mark.parametrize("n", [0, 1, 2])
def test_reuse_of_few_requests(n):
    requests = [_req(float(i), 4, (i + 1,)) for i in range(n)]
    assert reusable_blocks(requests).tolist() == [0] * n


def test_the_floor_always_computes_the_last_prompt_token():
    requests = [_req(0.0, 8, (1, 2)), _req(1.0, 8, (1, 2))]  # the second reuses both blocks = the whole prompt
    floor = floor_ttft_ms(requests, reusable_blocks(requests), PROFILE)
    assert floor[0] == pytest.approx(PROFILE.prefill_ms(8, 0))
    assert floor[1] == pytest.approx(PROFILE.prefill_ms(1, 7))  # 10 + 1 + 0.001 * (7 + 1)


def test_a_slice_counts_reuse_from_the_history_before_it():
    requests = [_req(0.0, 8, (1, 2)), _req(5.0, 10, (1, 2, 3)), _req(6.0, 10, (4, 5))]
    sliced = slice_floor(requests[:1], requests[1:], PROFILE)
    floor, tokens = sliced.floor_ms, sliced.reusable_tokens
    assert tokens.tolist() == [8, 0]
    assert sliced.by_request_key() == {"r0": 8, "r1": 0}
    assert floor.tolist() == pytest.approx([PROFILE.prefill_ms(2, 8), PROFILE.prefill_ms(10, 0)])
    summary = floor_summary(floor, [5.0, 6.0], frozenset({6}))
    assert summary.burst_ttft_p99_ms == pytest.approx(PROFILE.prefill_ms(10, 0))
    assert summary.ttft_p50_ms == pytest.approx(float(np.mean(floor)))


def test_the_burst_breakdown_counts_lost_reuse_and_its_recompute_cost():
    records = [RequestRecord("r0", 10.1, "f", 100, 1, cached_tokens=80, queue_ms=40.0, ttft_ms=100.0),
               RequestRecord("r1", 10.5, "f", 100, 1, cached_tokens=0, fetched_tokens=40, queue_ms=20.0,
                             ttft_ms=300.0),
               RequestRecord("r2", 11.0, "f", 100, 1, cached_tokens=0, queue_ms=500.0, ttft_ms=900.0)]
    reusable = {"r0": 80, "r1": 80, "r2": 0}
    s = summarize(records, frozenset({10}), 2000.0, ReplicaLedger().totals(), 64, {}, reusable, PROFILE)
    # Burst second 10: r0 reused all it could, r1 reused 40 of 80.
    assert s.burst_queue_ms_mean == pytest.approx(30.0)
    assert s.burst_cache_lost_ratio == pytest.approx(0.5)
    lost_ms = PROFILE.prefill_ms(60, 40) - PROFILE.prefill_ms(20, 80)
    assert s.burst_recompute_ms_mean == pytest.approx(lost_ms / 2)


def test_without_reuse_figures_the_breakdown_says_none():
    records = [RequestRecord("r0", 10.1, "f", 100, 1, queue_ms=40.0, ttft_ms=100.0)]
    s = summarize(records, frozenset({10}), 2000.0, ReplicaLedger().totals(), 64, {})
    assert s.burst_queue_ms_mean == pytest.approx(40.0)
    assert s.burst_cache_lost_ratio is None and s.burst_recompute_ms_mean is None


@pytest.mark.parametrize("chains, shared", [
    ([], 0),
    ([(1, 2, 3)], 3),
    ([(1, 2, 3), (1, 2, 4), (1, 5)], 1),
    ([(1, 2), (7, 2)], 0),
])
def test_the_shared_prefix_is_the_blocks_every_request_starts_with(chains, shared):
    requests = [_req(float(i), 4 * len(c), c) for i, c in enumerate(chains)]
    assert shared_prefix_blocks(requests) == shared


def test_a_request_returns_when_it_reuses_more_than_the_shared_prefix():
    history = [_req(0.0, 8, (1, 2))]
    replayed = [_req(1.0, 12, (1, 2, 3)),  # reuses 1, 2: beyond the shared block 1
                _req(2.0, 8, (1, 9)),  # reuses only the shared block
                _req(3.0, 12, (1, 9, 5))]  # reuses 1, 9 (request 2 computed 9)
    sliced = slice_floor(history, replayed, PROFILE)
    assert sliced.reusable_tokens.tolist() == [8, 4, 8]
    assert sliced.shared_tokens.tolist() == [4, 4, 4]
    assert sliced.returning.tolist() == [True, False, True]
    assert sliced.shared_by_request_key() == {"r0": 4, "r1": 4, "r2": 4}
    summary = floor_summary(sliced.floor_ms, [1.0, 2.0, 3.0], frozenset(), sliced.returning)
    assert summary.returning_ttft_p99_ms == pytest.approx(float(np.percentile(sliced.floor_ms[[0, 2]], 99)))
    assert floor_summary(sliced.floor_ms, [1.0, 2.0, 3.0], frozenset()).returning_ttft_p99_ms is None
