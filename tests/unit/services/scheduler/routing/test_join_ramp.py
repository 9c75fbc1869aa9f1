"""The join ramp (routing/join_ramp.py) alone and in the scheduler core: a
node joining a serving cluster takes misses only as fast as its ramp, what
it holds at once, and the planner pre-warms it before its full share."""
from collections import Counter

import pytest

from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.routing.join_ramp import JoinRamp
from tests.support.scheduler_scenarios import (
    BS,
    CHAIN,
    FAMILY,
    ScriptedForecasts,
    heartbeat_all,
    load,
    make_core,
    route_family,
    store,
)

N = NodeId("new")


def test_a_node_of_a_starting_cluster_never_ramps():
    ramp = JoinRamp(60.0)
    assert not ramp.joined(N, 0.0, cluster_routes=0, node_routes=0, live_after=4)
    assert not ramp.active(1.0) and not ramp.over(N, 1.0, 1000, 0)


def test_ramp_zero_is_off():
    ramp = JoinRamp(0.0)
    assert not ramp.joined(N, 0.0, cluster_routes=500, node_routes=0, live_after=4)
    assert not ramp.active(0.0)


def test_negative_ramp_is_refused():
    with pytest.raises(ValueError):
        JoinRamp(-1.0)


@pytest.mark.parametrize("at_s, routed, taken, over", [
    (0.0, 400, 0, False),  # its first route is never held back
    (0.0, 400, 1, True),  # phi = 0: nothing more
    (30.0, 400, 50, False),  # phi = 0.5, fair = 100: allowed 51
    (30.0, 400, 51, True),
    (59.9, 400, 99, False),
    (60.0, 400, 10_000, False),  # the ramp is over: never held back again
])
def test_allowance_grows_with_the_ramp(at_s, routed, taken, over):
    ramp = JoinRamp(60.0)
    assert ramp.joined(N, 100.0, cluster_routes=1000, node_routes=7, live_after=4)
    assert ramp.over(N, 100.0 + at_s, 1000 + routed, 7 + taken) is over


def test_the_ramp_ends_for_good_and_a_lost_node_stops_ramping():
    ramp = JoinRamp(10.0)
    ramp.joined(N, 0.0, 5, 0, 2)
    assert ramp.share(N, 5.0) == pytest.approx(0.5)
    assert not ramp.over(N, 10.0, 5, 0) and not ramp.active(10.0)
    ramp.joined(N, 20.0, 5, 0, 2)
    assert ramp.active(29.9) and ramp.ramping(29.9) == [N]
    assert not ramp.active(30.0) and ramp.ramping(30.0) == []  # its ramp has run its course, routed or not
    ramp.joined(N, 40.0, 5, 0, 2)
    ramp.forget(N)
    assert not ramp.active(41.0) and ramp.share(N, 41.0) == 1.0


def _serving_cluster(ramp_s: float):
    core, clock = make_core(3, "none", router={"join_ramp_s": ramp_s})
    heartbeat_all(core, 3)
    route_family(core, 30, family="warm")  # the cluster is serving before the new node comes
    heartbeat_all(core, 3)
    core.register_node("n3", "127.0.0.1:7003", NodeSizes(4096), None)
    heartbeat_all(core, 4)
    return core, clock


def _cold_routes(core, n: int, tag: str) -> Counter:
    """n first-seen requests (no shared prefix); before each, the old nodes
    report a little queue and the joiner none, so it is always the cheapest."""
    picks = Counter()
    for i in range(n):
        for old in ("n0", "n1", "n2"):
            load(core, old, 100)
        load(core, "n3", 0)
        chain = [20_000_000 + hash((tag, i, b)) % 1_000_000 for b in range(8)]
        picks[core.route(f"{tag}-{i}", chain, 8 * BS + 3, f"{tag}-{i}").node_id] += 1
    return picks


def test_without_a_ramp_the_idle_joiner_takes_misses_at_once():
    core, clock = _serving_cluster(0.0)
    assert _cold_routes(core, 40, "early")["n3"] == 40


def test_a_ramping_node_takes_misses_only_as_fast_as_its_ramp():
    core, clock = _serving_cluster(60.0)
    early = _cold_routes(core, 40, "early")  # phi = 0: its one route, then held back
    assert early["n3"] == 1
    clock.advance(30.0)
    middle = _cold_routes(core, 40, "middle")  # phi = 0.5 of a fair share of 80 / 4: allowed 11 in all
    assert middle["n3"] == 10
    clock.advance(31.0)
    late = _cold_routes(core, 40, "late")  # the ramp is over: the cheapest node takes them all
    assert late["n3"] == 40


def test_what_a_ramping_node_holds_goes_to_it_at_once():
    core, clock = _serving_cluster(60.0)
    _cold_routes(core, 10, "early")  # it is over its allowance now
    store(core, "n3", CHAIN)
    picks = route_family(core, 5)
    assert picks == ["n3"] * 5  # the longest prefix is its alone


def test_a_joining_node_gets_pre_warm_orders_before_its_full_share():
    forecasts = ScriptedForecasts()
    core, clock = make_core(3, "predictive", forecasts, router={"join_ramp_s": 60.0},
                            planner={"horizon_s": 1.0, "plan_every_s": 0.0})
    store(core, "n0", CHAIN)
    route_family(core, 2)
    heartbeat_all(core, 3)
    load(core, "n0", 40_000)  # the holder is swamped: its family's next requests queue there
    core.register_node("n3", "127.0.0.1:7003", NodeSizes(4096), None)
    load(core, "n3", 0)
    forecasts.counts = {FAMILY: 50.0}
    orders = core.tick()
    assert "n3" in {o.spec.target for o in orders}  # the joiner is pre-warmed ...
    assert core._ramp.share(NodeId("n3"), clock.now()) < 1.0  # ... while its share still ramps
