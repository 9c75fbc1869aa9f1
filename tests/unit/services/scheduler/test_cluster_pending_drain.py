"""The drain rule for routed work no queue report counts (cluster.py, router.pending_stale_s).

Every expected figure is worked by hand in the comments: a node's pending work
is worked off at 1 ms of prefill per ms of clock time, from pending_stale_s
after its last queue report, credited at each heartbeat up to it; tokens and
requests keep their share of what was routed, rounded up.
"""
import math

import pytest

from speckv.loadgen.sim.settings import SimSettings
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.cluster import Cluster, LoadReport
from speckv.services.scheduler.policy_config import load_policy_config

GEO = KVGeometry(2, 2, 8, "float16", 4)
A, B = NodeId("a"), NodeId("b")
KV_BEAT = LoadReport(free_pages=100)  # what a kvstore's own heartbeat carries: no queue figures


def cost(tokens: int, waiting: int) -> float:
    return 0.1 * tokens + 2.0 * waiting  # the tiny profile's queue_ms


def make(stale_s: float = 3.0) -> Cluster:
    return Cluster(node_timeout_s=100.0, queue_cost=cost, pending_stale_s=stale_s)


def pending(c: Cluster, node_id: NodeId = A) -> tuple[int, int, float]:
    n = c.get(node_id)
    return n.pending_tokens, n.pending_requests, n.pending_ms


def test_work_drains_only_after_the_stale_time_and_only_at_heartbeats():
    c = make()
    c.register(A, "h:1", NodeSizes(100), GEO, now=0.0)  # registration counts as a queue report: stale from 3.0
    c.add_pending(A, 1000, prefill_ms=2000.0, now=0.5)
    for t in (1.0, 2.0, 3.0):  # not past 0.0 + 3.0 yet: nothing is worked off
        c.heartbeat(A, KV_BEAT, now=t)
        assert pending(c) == (1000, 1, 2000.0)
    c.heartbeat(A, KV_BEAT, now=3.5)  # 3.5 - 3.0 = 0.5 s -> 500 ms off: 1500 left = 3/4
    assert pending(c) == (750, 1, 1500.0)  # 1000 x 3/4; ceil(1 x 3/4) = 1
    assert c.queue_ms(c.get(A)) == pytest.approx(0.1 * 750 + 2.0)
    assert c.least_loaded(1, now=3.9) == [A] and pending(c) == (750, 1, 1500.0)  # no beat, no credit
    c.heartbeat(A, KV_BEAT, now=4.0)  # 500 more: 1000 left = 1/2
    assert pending(c) == (500, 1, 1000.0)
    c.heartbeat(A, KV_BEAT, now=5.5)  # 1500 ms more than the 1000 left: all worked off
    assert pending(c) == (0, 0, 0.0) and c.queue_ms(c.get(A)) == 0.0


def test_shares_are_taken_from_what_was_routed_so_rounding_does_not_compound():
    c = make()
    c.register(A, "h:1", NodeSizes(100), GEO, now=0.0)
    for _ in range(3):
        c.add_pending(A, 100, prefill_ms=1000.0, now=1.0)  # 300 tokens, 3 requests, 3000 ms
    c.heartbeat(A, KV_BEAT, now=3.1)  # 100 ms off: 2900 left; 300 x 29/30 = 290; ceil(3 x 29/30 = 2.9) = 3
    assert pending(c) == (290, 3, 2900.0)
    c.heartbeat(A, KV_BEAT, now=4.0)  # 900 more: 2000 left = 2/3 of 3000
    assert pending(c) == (200, 2, 2000.0)


def test_a_node_that_stops_beating_keeps_its_work():
    """Only a heartbeat shows the node alive and working: a silent (maybe
    dead) node is not credited, so the router does not pile work onto it."""
    c = make()
    c.register(A, "h:1", NodeSizes(100), GEO, now=0.0)
    c.add_pending(A, 1000, prefill_ms=2000.0, now=0.5)
    assert c.least_loaded(1, now=50.0) == [A]
    assert pending(c) == (1000, 1, 2000.0)
    c.heartbeat(A, KV_BEAT, now=50.0)  # alive after all: 47 s past the stale point covers it
    assert pending(c) == (0, 0, 0.0)


def test_work_routed_while_draining_is_credited_from_when_it_came():
    c = make()
    c.register(A, "h:1", NodeSizes(100), GEO, now=0.0)
    c.heartbeat(A, KV_BEAT, now=5.0)  # stale, nothing pending
    c.add_pending(A, 100, prefill_ms=1000.0, now=5.75)
    c.heartbeat(A, KV_BEAT, now=6.0)  # 0.25 s since it came, not the 1 s since the last beat
    assert pending(c) == (75, 1, 750.0)
    c.add_pending(A, 20, prefill_ms=250.0, now=6.5)  # queued behind 750 - 500 = 250 ms still left
    c.heartbeat(A, KV_BEAT, now=7.0)  # level at 6.5: 250 + 250 = 500; 500 ms later: 0
    assert pending(c) == (0, 0, 0.0)
    c.heartbeat(A, KV_BEAT, now=8.0)
    c.add_pending(A, 40, prefill_ms=375.0, now=8.125)  # worked off by 8.5 (if the node lives)
    c.add_pending(A, 50, prefill_ms=500.0, now=8.875)  # so this one starts at 8.875
    c.heartbeat(A, KV_BEAT, now=9.0)  # 125 of its 500 ms done: 375 left = 3/7 of the 875 routed
    assert pending(c) == (39, 1, 375.0)  # ceil(90 x 3/7 = 38.6) = 39, ceil(2 x 3/7) = 1


def test_a_queue_report_resets_the_stale_clock_and_counts_the_work():
    c = make()
    c.register(A, "h:1", NodeSizes(100), GEO, now=0.0)
    c.add_pending(A, 1000, prefill_ms=2000.0, now=0.5)
    c.heartbeat(A, LoadReport(queued_tokens=900, waiting_requests=1), now=2.5)  # counts it: stale from 5.5
    assert pending(c) == (0, 0, 0.0)
    c.add_pending(A, 100, prefill_ms=1000.0, now=2.6)
    c.heartbeat(A, KV_BEAT, now=5.5)
    assert pending(c) == (100, 1, 1000.0)
    c.heartbeat(A, KV_BEAT, now=5.75)  # 250 ms past 5.5
    assert pending(c) == (75, 1, 750.0)
    assert c.get(A).queued_tokens == 975  # reported 900 + pending 75


def test_zero_ms_work_is_worked_off_by_any_creditable_time():
    c = make()
    c.register(A, "h:1", NodeSizes(100), GEO, now=0.0)
    c.add_pending(A, 40, now=1.0)  # no prefill time given
    c.heartbeat(A, KV_BEAT, now=3.0)
    assert pending(c) == (40, 1, 0.0)
    c.heartbeat(A, KV_BEAT, now=3.01)
    assert pending(c) == (0, 0, 0.0)


def test_regular_queue_reports_see_exactly_what_an_undrained_cluster_sees():
    """A node whose queue is reported every second (as every simulated node's
    is) never drains: its figures equal those of a cluster that never drains,
    kvstore beats and routes in between included."""
    drained, never = make(3.0), make(math.inf)
    for c in (drained, never):
        c.register(A, "h:1", NodeSizes(100), GEO, now=0.0)
        c.register(B, "h:2", NodeSizes(100), GEO, now=0.0)
    seen: list[list[object]] = [[], []]
    for i in range(20):
        t = float(i)
        for k, c in enumerate((drained, never)):
            c.heartbeat(A, LoadReport(queued_tokens=10 * i, waiting_requests=i % 3), now=t)
            c.add_pending(A, 300 + i, prefill_ms=700.0 + i, now=t + 0.25)
            c.add_pending(B, 50, prefill_ms=90.0, now=t + 0.3)
            c.heartbeat(A, KV_BEAT, now=t + 0.5)
            c.heartbeat(B, LoadReport(queued_tokens=5, waiting_requests=0, queued_prefill_ms=40.0), now=t + 0.6)
            c.add_pending(A, 7, prefill_ms=3.0, now=t + 0.9)
            n = c.get(A)
            seen[k].append((n.pending_tokens, n.pending_requests, n.pending_ms, c.queue_ms(n),
                            c.queue_ms(c.get(B)), c.least_loaded(2, now=t + 0.95)))
    assert seen[0] == seen[1]
    assert seen[0][-1][:3] == (300 + 19 + 7, 2, 700.0 + 19 + 3.0)


def test_the_board_order_follows_the_drain():
    c = make()
    c.register(A, "h:1", NodeSizes(100), GEO, now=0.0)
    c.register(B, "h:2", NodeSizes(100), GEO, now=0.0)
    c.heartbeat(A, LoadReport(queued_prefill_ms=0.0), now=0.0)
    c.add_pending(A, 100, prefill_ms=2000.0, now=0.1)  # a: 0 + 2000 ms
    for t in (1.0, 2.0, 3.0, 3.5):
        c.heartbeat(B, LoadReport(queued_prefill_ms=800.0), now=t)  # b: 800 ms, reported every beat
        c.heartbeat(A, KV_BEAT, now=t)
        assert c.least_loaded(2, now=t) == [B, A]
    assert c.queue_ms(c.get(A)) == pytest.approx(1500.0)  # 2000 - (3.5 - 3.0) s
    c.heartbeat(B, LoadReport(queued_prefill_ms=800.0), now=4.5)
    c.heartbeat(A, KV_BEAT, now=4.5)  # 2000 - 1500: 500 < 800
    assert c.queue_ms(c.get(A)) == pytest.approx(500.0)
    assert c.least_loaded(2, now=4.5) == [A, B] and c.least_loaded(1, now=4.5) == [A]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_pending_stale_s_must_be_positive(bad):
    with pytest.raises(InvalidArgument, match="pending_stale_s"):
        Cluster(node_timeout_s=5.0, pending_stale_s=bad)


def test_the_committed_stale_time_spans_several_heartbeats_and_the_simulators_report_gap():
    stale_s = load_policy_config().router.pending_stale_s
    assert stale_s == 3.0
    assert stale_s >= 3 * SchedulerConfig().heartbeat_interval_ms / 1000.0  # three beats of the default
    # the simulator reports every node's queue at least every liveness_s: its nodes never drain
    assert SimSettings(nodes=1, sizes=NodeSizes(1), heartbeat_s=0.1, tick_s=0.25, forecast_poll_s=1.0,
                       forecast_horizon_s=5.0, warmup_s=0.0).liveness_s + 0.1 < stale_s
