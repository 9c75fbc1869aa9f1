"""The routing hook: a policy without one is routed exactly as by the router
alone (same decision, same candidates, same RNG stream); a policy's preferred
node wins, is scored even when the selector did not take it, and is ignored
when it is down; the hook is told every route, whoever chose it."""
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.routing.preference import decide, preference_of
from speckv.services.scheduler.routing.router import KvAwareRouter, RouteQuery
from tests.support.scheduler_scenarios import BS, CHAIN, load, make_core, store


class Steer:
    """A preference naming one node; records what it was told."""

    def __init__(self, node: str | None) -> None:
        self.node = NodeId(node) if node else None
        self.told: list[tuple[str, float]] = []

    def preferred(self, query, candidates, now, live_count):
        return self.node

    def routed(self, query, node_id, now):
        self.told.append((node_id, now))


class Steering:
    name = "steering"

    def __init__(self, node: str | None) -> None:
        self.route_preference = Steer(node)


def query() -> RouteQuery:
    return RouteQuery("r", CHAIN + [1], (len(CHAIN) + 1) * BS + 3, Family("doc"))


def test_without_a_hook_the_routers_choice_and_rng_stream_are_untouched():
    core, _ = make_core(6)
    store(core, "n2", CHAIN)
    router = core._router
    twin = KvAwareRouter(get_profile("llama-3-8b-h100"), core.context.link, 0, 1.0)
    twin._rng.setstate(router._rng.getstate())
    cands = core._selector.candidates(CHAIN + [1], 100.0)
    decision, used = decide(object(), router, core._selector, query(), cands, 100.0, 100.0, lambda: 6)
    assert used is cands and decision == twin.choose(query(), cands)
    assert router._rng.getstate() == twin._rng.getstate()
    assert preference_of(object()) is None


def test_a_preferred_node_outside_the_candidates_is_scored_and_chosen():
    core, _ = make_core(8)
    store(core, "n2", CHAIN)
    load(core, "n5", 90_000)  # the most queued: the selector leaves it out
    cands = core._selector.candidates(CHAIN + [1], 100.0)
    assert "n5" not in {c.node_id for c in cands}
    policy = Steering("n5")
    decision, used = decide(policy, core._router, core._selector, query(), cands, 100.0, 99.5, lambda: 8)
    assert decision.node_id == "n5" and used[-1].node_id == "n5" and len(used) == len(cands) + 1
    assert decision.fetch_from == "n2" or decision.cached_blocks == 0  # priced as the router would: pull or recompute
    assert policy.route_preference.told == [("n5", 99.5)]  # on the arrival clock


def test_a_preferred_node_that_is_down_leaves_the_route_to_the_router():
    core, clock = make_core(3)
    clock.advance(6.0)  # past node_timeout_s for every node ...
    for node in ("n0", "n1"):
        load(core, node, 0)  # ... but these two beat again
    policy = Steering("n2")
    cands = core._selector.candidates(CHAIN + [1], clock.now())
    decision, _ = decide(policy, core._router, core._selector, query(), cands, clock.now(), clock.now(), lambda: 2)
    assert decision.node_id in {"n0", "n1"}
    assert policy.route_preference.told == [(decision.node_id, clock.now())]


def test_the_core_routes_through_the_policys_hook():
    core, _ = make_core(4)
    core._policy = Steering("n3")  # a test policy straight in: the registry builds only the shipped ones
    store(core, "n0", CHAIN)
    assert core.route("r", CHAIN + [1], (len(CHAIN) + 1) * BS + 3, "doc").node_id == "n3"
