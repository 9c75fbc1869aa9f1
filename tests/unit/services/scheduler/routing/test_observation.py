"""A route's observation, applied to a second core that did not route it,
leaves that core's planner state as if it had (routing/observation.py)."""
from dataclasses import replace

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.orders import OrderSpec, OrderState
from speckv.services.scheduler.ports import SchedulerSettings
from speckv.services.scheduler.routing.route_records import RouteRequestItem

CHAIN = list(range(100, 164))  # 64 blocks of 4 tokens (tiny profile)
BS = 4
FAMILY = Family("doc")


def replica() -> tuple[SchedulerCore, ManualClock]:
    """A core with three nodes: b holds CHAIN (and is busy), c a committed
    replica of its first half (leased for 2 s), a the ghosts of blocks it dropped."""
    clock = ManualClock(1000.0)
    core = SchedulerCore(SchedulerSettings(node_timeout_s=60.0, link_gbps=100.0), clock, get_profile("tiny"))
    for n in "abc":
        core.register_node(n, f"h:{n}", NodeSizes(1000), None)
    core.apply_kv_event(NodeId("b"), core.generation("b"), IndexEvent(HolderEventKind.STORED, CHAIN))
    core.apply_kv_event(NodeId("a"), core.generation("a"), IndexEvent(HolderEventKind.REMOVED, [7, 8, 9],
                                                                      tier=Tier.HOST))
    core.heartbeat("b", NodeLoad(queued_tokens=20_000))
    order = core.submit_order(OrderSpec(FAMILY, CHAIN[:32], NodeId("b"), NodeId("c"), 2_000))
    core.report_order(order.order_id, OrderState.COMMITTED)
    core.apply_kv_event(NodeId("c"), core.generation("c"), IndexEvent(HolderEventKind.STORED, CHAIN[:32]))
    clock.advance(0.5)
    return core, clock


def requests() -> list[RouteRequestItem]:
    return ([RouteRequestItem(f"d{i}", CHAIN, 64 * BS + 3, FAMILY) for i in range(6)]
            + [RouteRequestItem("half", CHAIN[:40], 40 * BS, FAMILY, arrival_time_s=999.0),
               RouteRequestItem("cold", [7, 8, 9], 3 * BS + 1),
               RouteRequestItem("empty", [], 50)])


def planner_state(core: SchedulerCore, now: float) -> tuple:
    """What the planner reads of routes: pending load (in each node's queue
    and route counts), link bookings and pull rates, the family catalog and
    its roots, reuse history, replica use and action outcomes."""
    view = core._view(now)
    families = sorted({FAMILY, Family("7"), *view.families.node_route_rates(now)})
    fams = tuple((f, view.families.profile(f), view.families.heat(f, now), view.families.surge_history(f, now),
                  view.index.family_root(f)) for f in families)
    reuse = tuple(view.reuse.p_reuse(NodeId(n), t, now) for n in "abc" for t in (Tier.DEVICE, Tier.HOST))
    state = core.cluster_state()
    entering = tuple(tuple(core._cluster.get(NodeId(n)).entering) for n in "abc")  # the prefill-ahead charge's
    return (entering, view.nodes, tuple(r.routes_total for r in state.nodes), dict(view.link_wait_ms), dict(view.pulls_per_s),
            fams, view.families.hot(now, 1), view.families.node_route_rates(now), reuse, state.replicas,
            core.action_outcomes(), view.replica_blocks)


def test_a_peer_that_observes_the_routes_ends_where_the_router_did():
    router, clock = replica()
    peer, peer_clock = replica()
    untouched = planner_state(peer, peer_clock.now())
    results = [router.route(r.request_id, r.block_hashes, r.prompt_tokens, r.family, r.arrival_time_s)
               for r in requests()[:4]]
    results += router.route_batch(requests()[4:])
    observations = [r.observation for r in results]
    assert all(o is not None for o in observations)
    assert [o.node_id for o in observations] == [r.node_id for r in results]
    assert any(o.fetch_from is not None for o in observations), "the scenario must exercise a pull"
    assert any(o.enters_in_ms > 0 for o in observations), "and a request that joins its queue after a transfer"
    peer.observe_routes(observations)
    assert planner_state(peer, clock.now()) == planner_state(router, clock.now())
    assert planner_state(peer, clock.now()) != untouched
    # and it stays so as both go on in time: the replica's lease ends, used on both
    clock.advance(3.0)
    peer_clock.advance(3.0)
    router.tick()
    peer.tick()
    assert router.cluster_state().replicas.kept == 1
    assert planner_state(peer, clock.now()) == planner_state(router, clock.now())


def test_observing_decides_nothing_and_skips_an_unknown_node():
    router, _ = replica()
    peer, clock = replica()
    observation = router.route("r", CHAIN, 64 * BS + 3, FAMILY).observation
    assert observation is not None
    before = planner_state(peer, clock.now())
    peer.observe_routes([replace(observation, node_id=NodeId("zz"))])
    assert planner_state(peer, clock.now()) == before


def test_an_observation_from_a_peer_whose_clock_runs_ahead_books_nothing_in_the_future():
    router, router_clock = replica()
    peer, clock = replica()
    router_clock.advance(30.0)
    observation = router.route("r", CHAIN, 64 * BS + 3, FAMILY).observation
    assert observation is not None and observation.arrival_s == pytest.approx(1030.5)
    peer.observe_routes([observation])
    view = peer._view(clock.now())
    assert view.families.heat(FAMILY, clock.now()) == 1
    assert observation.fetch_from is not None
    assert 0 < max(view.link_wait_ms.values()) < 30_000.0  # booked from the peer's now, not 30 s ahead of it


def test_a_request_joins_its_engine_queue_counted_from_its_arrival_not_from_the_route():
    # The warm start routes its history long after it arrived: a pull that ended then leaves no one still
    # fetching on the node (the prefill-ahead charge would count such phantoms); a fresh one books what is left.
    router, _ = replica()
    peer, clock = replica()
    observation = router.route("r", CHAIN, 64 * BS + 3, FAMILY).observation
    assert observation is not None
    now = clock.now()
    node = peer._cluster.get(observation.node_id)
    peer.observe_routes([replace(observation, arrival_s=now - 600.0, enters_in_ms=80.0)])
    assert peer._cluster.entering_ms(node, now) == ()
    peer.observe_routes([replace(observation, arrival_s=now - 0.03, enters_in_ms=80.0)])
    assert peer._cluster.entering_ms(node, now) == pytest.approx((50.0,))
