"""Event figures on hand-built records: affected windows, recovery, scale-out share."""
import pytest

from speckv.loadgen.experiments.event_metrics import EventOutcome, event_figures
from speckv.loadgen.experiments.metrics import RequestRecord


def rec(t: float, family: str, ttft: float, node: str = "n0", cached: int = 0) -> RequestRecord:
    return RequestRecord(f"{family}-{t}", t, family, 100, 1, node_id=node, ttft_ms=ttft, cached_tokens=cached)


def test_a_kill_compares_the_affected_families_before_and_after_and_finds_the_recovery():
    records = [rec(t, "hit", 100.0) for t in range(40, 100)]  # before: p99 100
    records += [rec(t, "hit", 900.0) for t in range(100, 120)]  # 20 s of misses after the kill
    records += [rec(t, "hit", 105.0) for t in range(120, 200)]  # then back within 10 %
    records += [rec(t, "other", 5000.0) for t in range(40, 200)]  # not affected: ignored
    kill = EventOutcome("kill", 100.0, "n1", frozenset({"hit"}), requests_resent=2, recompute_tokens=512)
    f = event_figures(records, kill)
    assert f.affected_ttft_p99_before_ms == pytest.approx(100.0)
    assert f.affected_ttft_p99_after_ms == pytest.approx(900.0)
    assert f.recovery_s == 20.0
    assert (f.requests_resent, f.recompute_tokens, f.affected_requests_before) == (2, 512, 60)


def test_no_recovery_within_the_run_is_none():
    records = [rec(t, "a", 100.0) for t in range(0, 10)] + [rec(t, "a", 999.0) for t in range(10, 40)]
    assert event_figures(records, EventOutcome("kill", 10.0, "n1", frozenset({"a"}))).recovery_s is None


def test_an_add_measures_its_share_and_hit_ratio_against_the_cluster():
    records = [rec(t, f"f{t % 4}", 50.0, node=f"n{t % 4}", cached=80) for t in range(0, 60)]
    records += [rec(t + 0.5, "new", 500.0, node="n4", cached=20) for t in range(0, 6)]
    f = event_figures(records, EventOutcome("add", 0.0, "n4", alive_nodes_after=5))
    # 66 requests in the minute over 5 nodes: a fair share is 13.2; n4 took 6.
    assert f.scale_out["new_node_fair_share"] == pytest.approx(6 / 13.2)
    assert f.scale_out["new_node_prefix_hit_ratio"] == pytest.approx(0.2)
    assert f.scale_out["cluster_prefix_hit_ratio"] == pytest.approx((60 * 80 + 6 * 20) / (66 * 100))
    assert f.affected_families == 1


def test_an_add_says_how_much_of_its_work_was_returning_and_what_it_recovered():
    # n4 gets one returning request (reusable 100, shared 20, cached 20: nothing beyond the
    # shared prefix recovered) and one first-seen; n0 gets a returning one fully recovered.
    records = [rec(1.0, "a", 50.0, node="n4", cached=20), rec(2.0, "b", 50.0, node="n4", cached=20),
               rec(3.0, "c", 50.0, node="n0", cached=100)]
    reusable = {r.request_id: 100 for r in records} | {records[1].request_id: 20}
    shared = {r.request_id: 20 for r in records}
    f = event_figures(records, EventOutcome("add", 0.0, "n4", alive_nodes_after=2), reusable, shared)
    assert f.scale_out["new_node_returning_share"] == pytest.approx(0.5)
    assert f.scale_out["new_node_reuse_recovered"] == pytest.approx(0.0)
    assert f.scale_out["cluster_reuse_recovered"] == pytest.approx(80 / 160)


def test_an_add_counts_its_pre_warm_orders_and_the_requests_its_replicas_served():
    records = [rec(1.0, "a", 50.0, node="n4", cached=20), rec(2.0, "b", 50.0, node="n4", cached=80),
               rec(70.0, "b", 50.0, node="n4", cached=80)]  # after the window: not counted
    records[1].replica_blocks = records[2].replica_blocks = 3
    counted = event_figures(records, EventOutcome("add", 0.0, "n4", alive_nodes_after=2, prewarm_orders=7))
    assert counted.scale_out["prewarm_orders"] == 7 and counted.scale_out["new_node_replica_hits"] == 1
    live = event_figures(records, EventOutcome("add", 0.0, "n4", alive_nodes_after=2))
    assert live.scale_out["prewarm_orders"] is None  # a run that does not count them says so
