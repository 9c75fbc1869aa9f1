"""The retain step's arithmetic on scripted cases with hand-computed values
(retention_plan.py): saving = P x (1 - d / ttl) x (prefill without the
prefix - with it), loss = blocks x P(reuse) x recompute per block, and with
displacement "occupancy" that loss x the seconds held past d / reuse.window_s;
and the node's retention budget: its registered cap less the retentions
still running (its own orders, or what the node reports retained where
that is more), a chain that does not fit priced and ordered as the head that
does."""
from __future__ import annotations

import dataclasses
import math

import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.cluster import LoadReport
from speckv.services.scheduler.forecasts import Forecast, ForecastKind
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.replication.family_options import OptionPricer
from speckv.services.scheduler.orders import ActionKind
from speckv.services.scheduler.replication.planner import Planner
from speckv.services.scheduler.replication.retention_plan import RetentionPlanner, held_past_s
from tests.support.scheduler_scenarios import BS, CHAIN, FAMILY, heartbeat_all, make_core, route_family, store

TTL = 300.0
PROMPT = (len(CHAIN) + 1) * BS + 3  # route_family's prompt: the chain, one own block, 3 tokens


class ScriptedReuse:
    """P(reuse) and removal rates as the test sets them (the ReuseReader interface)."""

    def __init__(self, p_reuse: float, rate_per_s: float) -> None:
        self.p, self.rate = p_reuse, rate_per_s

    def p_reuse(self, node, tier, now):
        return self.p

    def removal_rate(self, node, tier, now):
        return self.rate


def setup(p_reuse=0.2, rate=10.0, device=200, host=400, pricing="uniform", displacement="once", cap=None):
    core, clock = make_core(2, "none", capacity=device, host_pages=host, retain_max_blocks=cap,
                            retain={"pricing": pricing, "displacement": displacement})
    store(core, "n0", CHAIN)
    route_family(core, 1)  # the catalog learns the chain and prompt; last route at t = 100
    heartbeat_all(core, 2)
    ctx = core.context
    planner = RetentionPlanner(ctx.config, OptionPricer(ctx.profile, ctx.link, ctx.host_link))
    return core, clock, planner, ScriptedReuse(p_reuse, rate)


def plan(core, clock, planner, reuse, p, at, families=(FAMILY,), retained=None):
    """The planner's orders at `at`, n0's heartbeat reporting `retained`
    blocks retained (None: not reported)."""
    clock.advance(at - clock.now())
    heartbeat_all(core, 2)
    if retained is not None:
        core.heartbeat("n0", LoadReport(retained_blocks=retained))
    view = dataclasses.replace(core._view(clock.now()), reuse=reuse)
    forecasts = [Forecast(f, TTL, p, p, 1.0, ForecastKind.RETENTION) for f in families]
    return planner.plan(clock.now(), view, forecasts, "predictive")


def expected_net(core, p, left_s, p_reuse, held_scale=1.0):
    profile = core._profile
    full = profile.prefill_ms(PROMPT, 0)
    hit = profile.prefill_ms(PROMPT - len(CHAIN) * BS, len(CHAIN) * BS)
    return p * (1 - left_s / TTL) * (full - hit) - len(CHAIN) * p_reuse * full / (PROMPT / BS) * held_scale


def test_retains_a_likely_return_whose_prefix_would_leave_before_it():
    core, clock, planner, reuse = setup()
    # residency = 200 / 10 + 400 / 10 = 60 s from the last route at 100: gone at 160; at 130, 30 s left
    orders = plan(core, clock, planner, reuse, p=0.5, at=130.0)
    assert len(orders) == 1
    o = orders[0]
    assert (o.action, o.source, o.target, o.tier) == (ActionKind.RETAIN, NodeId("n0"), NodeId("n0"), Tier.HOST)
    assert o.block_hashes == CHAIN and o.lease_ms == 300_000 and o.forecast == "retention"
    assert o.expected_benefit_ms == pytest.approx(expected_net(core, 0.5, 30.0, 0.2))
    assert expected_net(core, 0.5, 30.0, 0.2) > 0


def test_a_retain_whose_pages_cost_more_than_it_saves_is_refused():
    core, clock, planner, reuse = setup(p_reuse=0.9)
    assert expected_net(core, 0.2, 30.0, 0.9) < 0
    assert plan(core, clock, planner, reuse, p=0.2, at=130.0) == []


def test_nothing_to_retain_when_the_prefix_outlives_the_window_anyway():
    core, clock, planner, reuse = setup(rate=0.1)  # residency 6,000 s
    assert plan(core, clock, planner, reuse, p=0.99, at=130.0) == []


def test_a_tier_nothing_leaves_holds_for_good():
    core, clock, planner, reuse = setup(rate=0.0)
    assert planner.residency_s(core._view(clock.now()), core._view(clock.now()).nodes[0], clock.now()) == math.inf
    assert plan(core, clock, planner, reuse, p=0.99, at=130.0) == []


def test_a_retention_is_renewed_only_once_half_of_it_has_run():
    core, clock, planner, reuse = setup()
    assert len(plan(core, clock, planner, reuse, p=0.5, at=130.0)) == 1
    assert plan(core, clock, planner, reuse, p=0.5, at=131.0) == []
    assert len(plan(core, clock, planner, reuse, p=0.5, at=130.0 + TTL / 2 + 1)) == 1


def test_below_the_probability_floor_or_with_no_holder_nothing_is_priced():
    core, clock, planner, reuse = setup()
    floor = load_policy_config().retain.min_probability
    assert plan(core, clock, planner, reuse, p=floor / 2, at=130.0) == []
    core2, clock2, planner2, reuse2 = setup()
    view = dataclasses.replace(core2._view(clock2.now()), reuse=reuse2)
    other = Forecast(Family("nobody-holds-this"), TTL, 0.9, 0.9, 1.0, ForecastKind.RETENTION)
    assert planner2.plan(clock2.now(), view, [other], "predictive") == []


def test_a_retention_forecast_never_drives_replicas_or_prefetches():
    ctx = setup()[0].context
    forecasts = [Forecast(FAMILY, TTL, 200.0, 200.0, 1.0, ForecastKind.RETENTION)]
    assert Planner(ctx.config, ctx.profile, ctx.link, ctx.host_link)._demand(forecasts) == {}


def test_with_a_curve_the_saving_is_the_chance_of_a_return_after_the_blocks_would_have_gone():
    core, clock, planner, reuse = setup(pricing="curve")
    # 30 s left at t = 130: returns within 30 s find the prefix anyway
    curve = ((15.0, 0.1), (30.0, 0.3), (150.0, 0.5), (300.0, 0.6))
    clock.advance(30.0)
    heartbeat_all(core, 2)
    view = dataclasses.replace(core._view(clock.now()), reuse=reuse)
    forecast = Forecast(FAMILY, TTL, 0.6, 0.6, 1.0, ForecastKind.RETENTION, curve)
    (order,) = planner.plan(clock.now(), view, [forecast], "predictive")
    profile = core._profile
    full = profile.prefill_ms(PROMPT, 0)
    hit = profile.prefill_ms(PROMPT - len(CHAIN) * BS, len(CHAIN) * BS)
    loss = len(CHAIN) * 0.2 * full / (PROMPT / BS)
    assert order.expected_benefit_ms == pytest.approx((0.6 - 0.3) * (full - hit) - loss)


def test_a_curve_that_has_every_return_before_the_blocks_leave_retains_nothing():
    core, clock, planner, reuse = setup(pricing="curve")
    clock.advance(30.0)
    heartbeat_all(core, 2)
    view = dataclasses.replace(core._view(clock.now()), reuse=reuse)
    forecast = Forecast(FAMILY, TTL, 0.6, 0.6, 1.0, ForecastKind.RETENTION, ((10.0, 0.6),))
    assert planner.plan(clock.now(), view, [forecast], "predictive") == []


def test_the_committed_uniform_pricing_ignores_a_curve():
    core, clock, planner, reuse = setup()
    clock.advance(30.0)
    heartbeat_all(core, 2)
    view = dataclasses.replace(core._view(clock.now()), reuse=reuse)
    forecast = Forecast(FAMILY, TTL, 0.5, 0.5, 1.0, ForecastKind.RETENTION, ((10.0, 0.5),))
    (order,) = planner.plan(clock.now(), view, [forecast], "predictive")
    assert order.expected_benefit_ms == pytest.approx(expected_net(core, 0.5, 30.0, 0.2))


@pytest.mark.parametrize("p, left_s, expected", [
    (0.0, 30.0, 270.0),  # never back: held the whole rest of the window
    (1.0, 30.0, 270.0 * 270.0 / 600.0),  # always back, uniformly: held until the return, if after d
    (0.5, 30.0, 0.5 * 270.0 + 0.5 * 121.5),
    (0.5, 0.0, 0.5 * 300.0 + 0.5 * 150.0),
    (0.5, 300.0, 0.0),  # would have stayed the whole window anyway
    (0.5, 400.0, 0.0),
    (1.7, 30.0, 121.5),  # chances clamped to [0, 1]
    (-0.2, 30.0, 270.0),
])
def test_held_past_s_is_the_expected_time_the_pages_stay_past_d(p, left_s, expected):
    assert held_past_s(p, left_s, TTL) == pytest.approx(expected)


def test_with_occupancy_the_loss_counts_every_window_the_pages_are_held():
    core, clock, planner, reuse = setup(p_reuse=0.02, displacement="occupancy")
    window_s = core.context.config.reuse.window_s
    held_s = 0.5 * 270.0 + 0.5 * 270.0 * 270.0 / 600.0  # 195.75 s past d = 30 s
    orders = plan(core, clock, planner, reuse, p=0.5, at=130.0)
    assert len(orders) == 1
    assert orders[0].expected_benefit_ms == pytest.approx(expected_net(core, 0.5, 30.0, 0.02, held_s / window_s))


def test_a_retain_worth_its_pages_once_but_not_for_all_the_time_it_holds_them_is_refused():
    held_scale = (0.5 * 270.0 + 0.5 * 270.0 * 270.0 / 600.0) / load_policy_config().reuse.window_s
    core, clock, planner, reuse = setup(p_reuse=0.2)
    assert expected_net(core, 0.5, 30.0, 0.2) > 0 > expected_net(core, 0.5, 30.0, 0.2, held_scale)
    assert len(plan(core, clock, planner, reuse, p=0.5, at=130.0)) == 1
    core, clock, planner, reuse = setup(p_reuse=0.2, displacement="occupancy")
    assert plan(core, clock, planner, reuse, p=0.5, at=130.0) == []


def test_an_unknown_displacement_is_refused_by_the_config():
    config = load_policy_config()
    bad = dataclasses.replace(config, retain=dataclasses.replace(config.retain, displacement="forever"))
    with pytest.raises(InvalidArgument, match="retain.displacement"):
        bad.validate()


OTHER = Family("doc2")
OTHER_CHAIN = list(range(9000, 9100))  # 100 blocks, held on n0 too


def setup_two(cap):
    """FAMILY (128 blocks) and OTHER (100 blocks) on n0, whose last tier
    retains at most cap blocks; both last routed at t = 100."""
    core, clock, planner, reuse = setup(cap=cap)
    store(core, "n0", OTHER_CHAIN, family=OTHER)
    route_family(core, 1, family=OTHER, chain=OTHER_CHAIN)
    return core, clock, planner, reuse


def head_net(core, p, left_s, p_reuse, blocks, chain_blocks):
    """The net of retaining the first `blocks` of a chain of chain_blocks (plus
    one own block and 3 tokens), all on the device tier: nothing to promote."""
    profile = core._profile
    prompt = (chain_blocks + 1) * BS + 3
    full = profile.prefill_ms(prompt, 0)
    hit = profile.prefill_ms(prompt - blocks * BS, blocks * BS)
    return p * (1 - left_s / TTL) * (full - hit) - blocks * p_reuse * full / (prompt / BS)


def test_a_chain_the_node_has_no_room_for_is_priced_for_the_head_it_would_keep():
    # Room for 100 of its 128 blocks: the store would keep the head, so that head is what is priced and ordered.
    core, clock, planner, reuse = setup(cap=100)
    orders = plan(core, clock, planner, reuse, p=0.5, at=130.0)
    assert [o.block_hashes for o in orders] == [CHAIN[:100]]
    assert orders[0].expected_benefit_ms == pytest.approx(head_net(core, 0.5, 30.0, 0.2, 100, len(CHAIN)))
    assert head_net(core, 0.5, 30.0, 0.2, 100, len(CHAIN)) < expected_net(core, 0.5, 30.0, 0.2)
    core, clock, planner, reuse = setup(cap=len(CHAIN))
    assert [o.block_hashes for o in plan(core, clock, planner, reuse, p=0.5, at=130.0)] == [CHAIN]


def test_a_head_not_worth_its_pages_is_not_ordered():
    # p_reuse 0.37: the whole chain is worth it; a 20-block head, saving the cheapest prefill (attention
    # grows with the prefix), is not.
    assert head_net(setup()[0], 0.5, 30.0, 0.37, 20, len(CHAIN)) < 0 < expected_net(setup()[0], 0.5, 30.0, 0.37)
    core, clock, planner, reuse = setup(p_reuse=0.37, cap=20)
    assert plan(core, clock, planner, reuse, p=0.5, at=130.0) == []
    core, clock, planner, reuse = setup(p_reuse=0.37, cap=len(CHAIN))
    assert len(plan(core, clock, planner, reuse, p=0.5, at=130.0)) == 1


def test_the_budget_is_the_cap_less_the_retentions_still_running():
    core, clock, planner, reuse = setup_two(cap=len(CHAIN) + len(OTHER_CHAIN) - 1)
    # Largest net first: FAMILY (128 blocks) takes its room, OTHER gets the 99-block head that is left.
    orders = plan(core, clock, planner, reuse, p=0.5, at=130.0, families=(FAMILY, OTHER))
    assert [(o.family, len(o.block_hashes)) for o in orders] == [(FAMILY, len(CHAIN)), (OTHER, len(OTHER_CHAIN) - 1)]
    core, clock, planner, reuse = setup_two(cap=len(CHAIN) + len(OTHER_CHAIN))
    orders = plan(core, clock, planner, reuse, p=0.5, at=130.0, families=(FAMILY, OTHER))
    assert sorted((o.family, len(o.block_hashes)) for o in orders) == [(FAMILY, len(CHAIN)), (OTHER, len(OTHER_CHAIN))]


def test_a_full_budget_orders_nothing_more():
    core, clock, planner, reuse = setup_two(cap=len(OTHER_CHAIN))
    orders = plan(core, clock, planner, reuse, p=0.5, at=130.0, families=(FAMILY, OTHER))
    assert [(o.family, len(o.block_hashes)) for o in orders] == [(FAMILY, len(OTHER_CHAIN))]  # the head that fits


def test_a_renewal_frees_its_own_blocks_and_a_lapsed_retention_frees_its_room():
    core, clock, planner, reuse = setup_two(cap=len(CHAIN))
    assert [o.family for o in plan(core, clock, planner, reuse, p=0.5, at=130.0, families=(FAMILY,))] == [FAMILY]
    assert plan(core, clock, planner, reuse, p=0.5, at=131.0, families=(OTHER,)) == []  # no room beside it
    # Renewed once half its window has run: it fits in the room it already holds.
    renewed_at = 130.0 + TTL / 2 + 1
    route_family(core, 1)  # its last use moves on, so its blocks would leave again before the window ends
    assert [o.family for o in plan(core, clock, planner, reuse, p=0.5, at=renewed_at, families=(FAMILY,))] == [FAMILY]
    # Its renewal runs until renewed_at + TTL; after that the room is OTHER's again.
    route_family(core, 1, family=OTHER, chain=OTHER_CHAIN)
    later = renewed_at + TTL + 1
    store(core, "n0", OTHER_CHAIN, family=OTHER)
    route_family(core, 1, family=OTHER, chain=OTHER_CHAIN)
    assert [o.family for o in plan(core, clock, planner, reuse, p=0.5, at=later, families=(OTHER,))] == [OTHER]


def test_a_node_that_reports_a_cap_of_nothing_gets_no_retain():
    core, clock, planner, reuse = setup(cap=0)
    assert plan(core, clock, planner, reuse, p=0.9, at=130.0) == []


def test_chains_that_share_a_prefix_share_its_place_under_the_cap():
    # A sub-agent's chain repeats the first 100 blocks of FAMILY's: retaining both holds 128 + 28 blocks.
    core, clock, planner, reuse = setup(cap=len(CHAIN) + 28)
    branch, branch_chain = Family("branch"), CHAIN[:100] + list(range(7000, 7028))
    store(core, "n0", branch_chain, family=branch)
    route_family(core, 1, family=branch, chain=branch_chain)
    orders = plan(core, clock, planner, reuse, p=0.5, at=130.0, families=(FAMILY, branch))
    assert sorted((o.family, len(o.block_hashes)) for o in orders) == [(branch, 128), (FAMILY, 128)]
    # One block less under the cap: the second chain's last new block no longer fits.
    core, clock, planner, reuse = setup(cap=len(CHAIN) + 27)
    store(core, "n0", branch_chain, family=branch)
    route_family(core, 1, family=branch, chain=branch_chain)
    orders = plan(core, clock, planner, reuse, p=0.5, at=130.0, families=(FAMILY, branch))
    assert sorted(len(o.block_hashes) for o in orders) == [127, 128]


def test_retains_the_node_reports_but_the_planner_never_ordered_take_their_room():
    # 28 of n0's 128 places hold retains this planner never saw (an operator's, or a planner before a
    # restart): the store would keep a 100-block head, so that is what is ordered.
    core, clock, planner, reuse = setup(cap=len(CHAIN))
    orders = plan(core, clock, planner, reuse, p=0.5, at=130.0, retained=28)
    assert [o.block_hashes for o in orders] == [CHAIN[:100]]
    core, clock, planner, reuse = setup(cap=len(CHAIN))
    assert [o.block_hashes for o in plan(core, clock, planner, reuse, p=0.5, at=130.0, retained=0)] == [CHAIN]


def test_a_report_older_than_the_planners_own_retains_does_not_free_their_room():
    # The heartbeat still says 0 after FAMILY's 128 blocks were ordered: the shadow's count stands.
    core, clock, planner, reuse = setup_two(cap=len(CHAIN) + len(OTHER_CHAIN) - 1)
    assert [o.family for o in plan(core, clock, planner, reuse, p=0.5, at=130.0, retained=0)] == [FAMILY]
    orders = plan(core, clock, planner, reuse, p=0.5, at=131.0, families=(OTHER,), retained=0)
    assert [(o.family, len(o.block_hashes)) for o in orders] == [(OTHER, len(OTHER_CHAIN) - 1)]


def test_a_node_that_registered_again_gets_an_empty_shadow():
    # Its store may have restarted empty: what this planner ordered there before is no longer counted.
    core, clock, planner, reuse = setup_two(cap=len(CHAIN))
    assert [o.family for o in plan(core, clock, planner, reuse, p=0.5, at=130.0)] == [FAMILY]
    assert plan(core, clock, planner, reuse, p=0.5, at=131.0, families=(OTHER,)) == []  # no room beside it
    core.register_node("n0", "127.0.0.1:7000", NodeSizes(200, 400, len(CHAIN)), None)
    store(core, "n0", OTHER_CHAIN, family=OTHER)
    route_family(core, 1, family=OTHER, chain=OTHER_CHAIN)
    orders = plan(core, clock, planner, reuse, p=0.5, at=132.0, families=(OTHER,))
    assert [(o.family, len(o.block_hashes)) for o in orders] == [(OTHER, len(OTHER_CHAIN))]


def test_a_report_made_before_the_planners_own_retain_lapsed_does_not_count_it_as_another():
    # n0 reported FAMILY's 128 blocks at 429.5 s; they lapsed at 430 s. At 431 s the report is not yet
    # renewed: those 128 are no one else's, so OTHER fits whole beside the cap's 227.
    core, clock, planner, reuse = setup_two(cap=len(CHAIN) + len(OTHER_CHAIN) - 1)
    assert [o.family for o in plan(core, clock, planner, reuse, p=0.5, at=130.0)] == [FAMILY]
    clock.advance(429.5 - clock.now())
    heartbeat_all(core, 2)
    core.heartbeat("n0", LoadReport(retained_blocks=len(CHAIN)))
    clock.advance(431.0 - clock.now())
    view = dataclasses.replace(core._view(clock.now()), reuse=reuse)
    orders = planner.plan(clock.now(), view, [Forecast(OTHER, TTL, 0.5, 0.5, 1.0, ForecastKind.RETENTION)],
                          "predictive")
    assert [(o.family, len(o.block_hashes)) for o in orders] == [(OTHER, len(OTHER_CHAIN))]


def test_a_family_retained_on_a_node_that_registered_again_may_be_retained_anew_at_once():
    core, clock, planner, reuse = setup(cap=len(CHAIN))
    assert [o.family for o in plan(core, clock, planner, reuse, p=0.5, at=130.0)] == [FAMILY]
    assert plan(core, clock, planner, reuse, p=0.5, at=131.0) == []  # retained until 430 s: not renewed yet
    core.register_node("n0", "127.0.0.1:7000", NodeSizes(200, 400, len(CHAIN)), None)  # its store may have restarted
    store(core, "n0", CHAIN)
    route_family(core, 1)
    assert [o.block_hashes for o in plan(core, clock, planner, reuse, p=0.5, at=132.0)] == [CHAIN]


@pytest.mark.parametrize("age_s, blocks", [(29.0, 100), (31.0, len(CHAIN))])
def test_a_count_older_than_the_lapse_log_is_taken_as_unknown(age_s, blocks):
    # n0 said 28 blocks were retained by others; past LAPSE_LOG_S (30 s) that count is no longer used.
    core, clock, planner, reuse = setup(cap=len(CHAIN))
    core.heartbeat("n0", LoadReport(retained_blocks=28))
    clock.advance(age_s)
    for node in ("n0", "n1"):
        core.heartbeat(node, LoadReport(free_pages=4096))  # alive, the count as it was
    view = dataclasses.replace(core._view(clock.now()), reuse=reuse)
    orders = planner.plan(clock.now(), view, [Forecast(FAMILY, TTL, 0.5, 0.5, 1.0, ForecastKind.RETENTION)],
                          "predictive")
    assert [len(o.block_hashes) for o in orders] == [blocks]
