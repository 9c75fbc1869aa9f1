"""Metrics of a scripted scenario match hand-computed values."""
from __future__ import annotations

from dataclasses import replace

import pytest

from speckv.loadgen.experiments.metrics import RequestRecord, burst_seconds, summarize
from speckv.loadgen.experiments.replica_ledger import KVEventKind, ReplicaLedger
from speckv.loadgen.experiments.results import FloorSummary, with_avoidable_closed


def test_burst_seconds_are_the_top_five_percent_of_all_trace_seconds():
    # 40 seconds: second 7 has 9 arrivals, second 20 has 6, the rest 0 or 1.
    arrivals = [s + 0.5 for s in range(0, 40, 2)] + [7.1] * 8 + [20.2] * 5
    # ceil(0.05 * 40) = 2nd busiest second has 6 arrivals: seconds 7 and 20.
    assert burst_seconds(arrivals) == frozenset({7, 20})


def test_burst_seconds_never_include_empty_seconds():
    assert burst_seconds([0.1, 5.0]) == frozenset({0, 5})


def _record(i, arrival, ttft, replica=0, error="", cached=0):
    return RequestRecord(f"r{i}", arrival, "f", 1000, 10, "node-0", cached_tokens=cached, ttft_ms=ttft,
                         tpot_ms=10.0 if ttft is not None else None, e2e_ms=ttft, replica_blocks=replica,
                         error=error)


def test_summary_of_a_scripted_scenario_matches_hand_computed_values():
    ledger = ReplicaLedger()
    ledger.apply("node-1", KVEventKind.COMMITTED, [1, 2, 3, 4], 1.0, "o1", "f")
    ledger.apply("node-1", KVEventKind.COMMITTED, [4, 5], 1.5, "o2", "f")  # 4 is already a replica
    ledger.apply("node-1", KVEventKind.STORED, [9], 1.6)
    assert ledger.note_read("node-1", [1, 2, 9]) == 2
    assert ledger.note_read("node-1", [1]) == 1  # read again: still one block read
    ledger.apply("node-1", KVEventKind.REMOVED, [3, 1], 2.0)  # 3 wasted, 1 was read
    records = [
        _record(0, 10.2, 100.0, cached=500),
        _record(1, 10.7, 300.0, replica=2),
        _record(2, 11.1, 2500.0),
        _record(3, 12.0, None, error="route: UNAVAILABLE"),
        _record(4, 13.5, 1000.0, replica=1),
    ]
    s = summarize(records, frozenset({10}), ttft_target_ms=2000.0, replicas=ledger.totals(),
                  bytes_per_block=64, orders={"COMMITTED": 2})
    assert s.requests == 5 and s.served == 4 and s.errors == 1
    # TTFTs sorted: 100, 300, 1000, 2500. Linear percentiles: p50 = 650,
    # p99 = 1000 + 0.97 * 1500 = 2455.
    assert s.ttft_p50_ms == pytest.approx(650.0)
    assert s.ttft_p99_ms == pytest.approx(2455.0)
    # Burst second 10 holds requests 0 and 1: p99 = 100 + 0.99 * 200.
    assert s.burst_requests == 2
    assert s.burst_ttft_p99_ms == pytest.approx(298.0)
    # 3 of 5 requests within 2000 ms (the error counts as a miss).
    assert s.slo_attainment == pytest.approx(0.6)
    # 5 distinct replica blocks of 64 bytes; read: 1 and 2; wasted: 3 (removed), 4 and 5 (never read).
    assert s.bytes_replicated == 320
    assert s.replica_blocks_read == 2
    assert s.wasted_bytes_ratio == pytest.approx(3 / 5)
    assert s.replica_hit_ratio == pytest.approx(2 / 4)
    assert s.prefix_hit_ratio == pytest.approx(500 / 4000)


def test_no_replication_means_no_waste_and_no_hits():
    s = summarize([_record(0, 1.0, 50.0)], frozenset(), 2000.0, ReplicaLedger().totals(), 64, {})
    assert s.bytes_replicated == 0 and s.wasted_bytes_ratio == 0.0 and s.replica_hit_ratio == 0.0
    assert s.burst_ttft_p99_ms is None


def test_a_snapshot_drops_replicas_the_node_no_longer_has():
    ledger = ReplicaLedger()
    ledger.apply("n", KVEventKind.COMMITTED, [1, 2], 0.0, "o", "f")
    ledger.apply("n", KVEventKind.SNAPSHOT, [2, 7], 1.0)
    assert ledger.note_read("n", [1, 2]) == 1
    totals = ledger.totals()
    assert (totals.committed_blocks, totals.read_blocks, totals.wasted_blocks) == (2, 1, 1)


def test_each_order_landing_records_its_commit_time_and_first_read():
    ledger = ReplicaLedger()
    ledger.apply("n1", KVEventKind.COMMITTED, [1, 2, 3], 5.0, "o1", "fa")
    ledger.apply("n2", KVEventKind.COMMITTED, [1, 2], 5.5, "o2", "fa")
    ledger.apply("n1", KVEventKind.COMMITTED, [3, 4], 6.0, "o3", "fb")  # 3 is already o1's replica
    assert ledger.note_read("n1", [1, 2], time_s=7.25) == 2
    assert ledger.note_read("n1", [1, 2, 3], time_s=9.0) == 3
    fates = {f.order_id: f for f in ledger.totals().fates}
    assert (fates["o1"].node, fates["o1"].family, fates["o1"].committed_s, fates["o1"].blocks) == ("n1", "fa", 5.0, 3)
    assert fates["o1"].read_blocks == 3 and fates["o1"].first_read_s == 7.25
    assert fates["o2"].read_blocks == 0 and fates["o2"].first_read_s is None
    assert fates["o3"].blocks == 1 and fates["o3"].read_blocks == 0
    s = summarize([_record(0, 7.25, 100.0, replica=2)], frozenset(), 2000.0, ledger.totals(), 64, {})
    assert s.replica_landings == 3 and s.replica_landings_read_ratio == pytest.approx(1 / 3)
    assert s.replica_read_lead_s_p50 == pytest.approx(2.25)  # o1: committed 5.0, first read 7.25


def test_reused_tokens_beyond_the_shared_prefix_are_split_by_where_they_came_from():
    records = [
        # 400 reusable, the first 100 shared: 250 on the node, 100 more pulled, 50 recomputed.
        RequestRecord("a", 1.0, "f", 1000, 1, cached_tokens=250, fetched_tokens=100, ttft_ms=900.0),
        # only the shared prefix is reusable: first-seen
        RequestRecord("b", 2.0, "f", 1000, 1, cached_tokens=100, ttft_ms=300.0),
        # 400 reusable, 100 shared: 50 cached (short of the shared prefix), 200 pulled, 150 recomputed
        RequestRecord("c", 3.0, "f", 1000, 1, cached_tokens=50, fetched_tokens=200, ttft_ms=700.0),
        RequestRecord("d", 4.0, "f", 1000, 1, ttft_ms=100.0),  # nothing reusable: first-seen
    ]
    reusable, shared = {"a": 400, "b": 100, "c": 400, "d": 0}, {"a": 100, "b": 100, "c": 100, "d": 0}
    s = summarize(records, frozenset(), 2000.0, ReplicaLedger().totals(), 64, {}, reusable, None, shared)
    assert s.returning_requests == 2
    assert s.returning_ttft_p50_ms == pytest.approx(800.0) and s.returning_ttft_p99_ms == pytest.approx(898.0)
    assert s.first_seen_ttft_p99_ms == pytest.approx(100.0 + 0.99 * 200.0)
    # Beyond the shared prefix: 300 + 300 reusable; device 150 + 0, peer 100 + 150, recomputed 50 + 150.
    assert s.device_hit_ratio == pytest.approx(150 / 600) and s.peer_pull_ratio == pytest.approx(250 / 600)
    assert s.recompute_ratio == pytest.approx(200 / 600) and s.host_hit_ratio == 0.0
    assert s.reuse_recovered_ratio == pytest.approx(400 / 600)


def test_without_the_floor_figures_the_split_is_not_reported():
    s = summarize([_record(0, 1.0, 50.0)], frozenset(), 2000.0, ReplicaLedger().totals(), 64, {})
    assert s.returning_requests is None and s.reuse_recovered_ratio is None and s.avoidable_closed is None


def test_avoidable_latency_closed_is_measured_from_none_to_the_floor():
    base = summarize([_record(0, 1.0, 50.0)], frozenset(), 2000.0, ReplicaLedger().totals(), 64, {})
    policies = {"none": replace(base, returning_ttft_p99_ms=1000.0),
                "oracle": replace(base, returning_ttft_p99_ms=700.0),
                "worse": replace(base, returning_ttft_p99_ms=1100.0)}
    floor = FloorSummary(None, None, None, None, returning_ttft_p99_ms=400.0)
    closed = {n: s.avoidable_closed for n, s in with_avoidable_closed(policies, floor).items()}
    assert closed == pytest.approx({"none": 0.0, "oracle": 0.5, "worse": -1 / 6})
    assert with_avoidable_closed({"oracle": policies["oracle"]}, floor)["oracle"].avoidable_closed is None
    at_floor = FloorSummary(None, None, None, None, returning_ttft_p99_ms=1000.0)
    assert with_avoidable_closed(policies, at_floor)["oracle"].avoidable_closed is None


def test_disk_loads_are_counted_apart_from_host_hits():
    """Of the tokens promoted before prefill, those read off the disk first
    are the disk's share (and their wait a disk load's), the rest the host's."""
    records = [
        # 400 reusable, 100 shared: 300 cached beyond it, 200 of them promoted, 120 of those off the disk.
        RequestRecord("a", 1.0, "f", 1000, 1, cached_tokens=400, promoted_tokens=200, disk_tokens=120,
                      promote_ms=30.0, ttft_ms=500.0),
        RequestRecord("b", 2.0, "f", 1000, 1, cached_tokens=400, promoted_tokens=100, promote_ms=2.0, ttft_ms=300.0),
    ]
    reusable, shared = {"a": 400, "b": 400}, {"a": 100, "b": 100}
    s = summarize(records, frozenset(), 2000.0, ReplicaLedger().totals(), 64, {}, reusable, None, shared)
    assert s.disk_load_ratio == pytest.approx(120 / 600) and s.host_hit_ratio == pytest.approx((80 + 100) / 600)
    assert s.device_hit_ratio == pytest.approx((100 + 200) / 600) and s.reuse_recovered_ratio == pytest.approx(1.0)
    assert s.disk_load_ms_mean == pytest.approx(30.0) and s.promotion_ms_mean == pytest.approx(2.0)
