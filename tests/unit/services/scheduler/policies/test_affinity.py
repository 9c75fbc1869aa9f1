"""Policy `affinity` (llm-d's burst prefix-cache affinity): the window's
placements steer the requests that follow, under the fair share and the
per-group cap; the window expires; the policy never issues an order."""
import dataclasses

from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.policies.affinity import AffinityPolicy, BurstWindow
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.routing.router import Candidate, RouteQuery
from tests.support.scheduler_scenarios import BS, CHAIN, make_core, route_family

NEED = 512 // BS  # min_colocate_tokens 512 at 16-token blocks: 32 shared blocks


def window(**changes) -> BurstWindow:
    return BurstWindow(dataclasses.replace(load_policy_config().affinity, **changes))


def q(chain: list[int]) -> RouteQuery:
    return RouteQuery("r", chain, len(chain) * BS + 3, Family("doc"))


def cands(*loads: tuple[str, float]) -> list[Candidate]:
    return [Candidate(NodeId(n), 0, 0, BS, 2 << 20, queue_ms) for n, queue_ms in loads]


TWO = cands(("n0", 0.0), ("n1", 0.0))


def test_the_committed_parameters_are_llm_ds_defaults_and_the_streaming_reading():
    a = load_policy_config().affinity
    assert (a.window_ms, a.max_per_replica, a.min_colocate_tokens, a.spill) == (100.0, -1, 512, "router")


def test_the_first_route_of_a_window_is_the_routers():
    w = window()
    assert w.preferred(q(CHAIN + [1]), TWO, 10.0, lambda: 2) is None


def test_a_prefix_sharer_goes_to_the_longest_run_under_its_fair_share_then_spills_to_the_next():
    w = window()
    w.routed(q(CHAIN + [1]), NodeId("n0"), 10.00)  # carries all 128 blocks of CHAIN
    w.routed(q(CHAIN[:40] + [2]), NodeId("n1"), 10.01)  # carries 40
    # 3rd request of the window over 2 live nodes: fair share ceil(3 / 2) = 2, both under it: the longer run wins
    assert w.preferred(q(CHAIN + [3]), TWO, 10.02, lambda: 2) == "n0"
    w.routed(q(CHAIN + [3]), NodeId("n0"), 10.02)
    # 4th: share ceil(4 / 2) = 2; n0 holds 2 of the window's requests: it spills to n1 (40 >= 32 blocks shared)
    assert w.preferred(q(CHAIN + [4]), TWO, 10.03, lambda: 2) == "n1"
    w.routed(q(CHAIN + [4]), NodeId("n1"), 10.03)
    # 5th: share ceil(5 / 2) = 3: n0 is under it again
    assert w.preferred(q(CHAIN + [5]), TWO, 10.04, lambda: 2) == "n0"


def test_a_burst_within_one_nodes_share_spills_to_the_router_when_every_sharer_is_full():
    w = window()
    w.routed(q(CHAIN + [1]), NodeId("n0"), 10.0)
    # 2nd request over 16 live nodes: share ceil(2 / 16) = 1, n0 holds 1: the router decides
    assert w.preferred(q(CHAIN + [2]), TWO, 10.01, lambda: 16) is None
    # with llm-d's own spill, the least window-loaded candidate (then the shorter queue)
    spill = window(spill="least_loaded")
    spill.routed(q(CHAIN + [1]), NodeId("n0"), 10.0)
    assert spill.preferred(q(CHAIN + [2]), cands(("n0", 0.0), ("n1", 9.0), ("n2", 3.0)), 10.01, lambda: 16) == "n2"


def test_too_short_a_shared_prefix_earns_no_affinity():
    w = window()
    w.routed(q(CHAIN + [1]), NodeId("n0"), 10.0)
    short = CHAIN[:NEED - 1] + [7, 8]  # shares 31 blocks, one fewer than 512 tokens
    assert w.preferred(q(short), TWO, 10.01, lambda: 1) is None
    assert w.preferred(q(CHAIN[:NEED] + [9]), TWO, 10.01, lambda: 1) == "n0"
    assert window(min_colocate_tokens=0).preferred(q(CHAIN + [2]), TWO, 10.01, lambda: 1) is None  # identical only


def test_an_identical_group_stays_whole_or_fills_max_per_replica_before_spilling():
    whole = window()
    for _ in range(5):
        whole.routed(q(CHAIN), NodeId("n1"), 10.0)
    assert whole.preferred(q(CHAIN), TWO, 10.05, lambda: 16) == "n1"  # no cap and no fair share on a group
    capped = window(max_per_replica=2)
    capped.routed(q(CHAIN), NodeId("n1"), 10.0)
    assert capped.preferred(q(CHAIN), TWO, 10.01, lambda: 16) == "n1"
    capped.routed(q(CHAIN), NodeId("n1"), 10.01)
    assert capped.preferred(q(CHAIN), TWO, 10.02, lambda: 16) is None  # n1 holds 2: the router places the 3rd
    capped.routed(q(CHAIN), NodeId("n0"), 10.02)
    assert capped.preferred(q(CHAIN), TWO, 10.03, lambda: 16) == "n0"  # the group follows its new node


def test_the_window_expires_window_ms_after_it_opened():
    w = window()
    w.routed(q(CHAIN), NodeId("n1"), 10.0)
    assert w.preferred(q(CHAIN), TWO, 10.099, lambda: 2) == "n1"
    assert w.preferred(q(CHAIN), TWO, 10.100, lambda: 2) is None  # closed: nothing placed in the new one
    w.routed(q(CHAIN), NodeId("n0"), 10.100)  # opens the next window
    assert w.preferred(q(CHAIN), TWO, 10.15, lambda: 2) == "n0"


def test_through_the_core_an_identical_burst_lands_on_one_node_and_no_order_is_issued():
    core, clock = make_core(4, "affinity")
    picks = [core.route(f"r{i}", CHAIN, len(CHAIN) * BS + 3, "doc", arrival_time_s=100.0).node_id for i in range(6)]
    assert len(set(picks)) == 1
    assert core.tick() == [] and sum(core.order_counts().values()) == 0
    clock.advance(0.2)  # past the window: the router spreads the next one off the node the burst queued on
    assert core.route("r6", CHAIN, len(CHAIN) * BS + 3, "doc").node_id != picks[0]
    baseline, _ = make_core(4, "none")  # the same burst under the router alone spreads
    assert len({baseline.route(f"r{i}", CHAIN, len(CHAIN) * BS + 3, "doc").node_id for i in range(6)}) > 1


def test_set_policy_switches_to_affinity_and_back():
    core, clock = make_core(3)
    assert core.set_policy("affinity").name == "affinity"
    route_family(core, 3)
    assert core.tick() == [] and core.set_policy("none").name == "none"


def test_the_policy_plans_nothing():
    policy = AffinityPolicy(load_policy_config().affinity)
    assert policy.plan(1.0, None) == [] and policy.needs_view is False
