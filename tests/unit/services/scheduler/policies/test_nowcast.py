"""The nowcast: the burst a family is in, priced as demand by `predictive`
(policies/nowcast.py), from the family catalog's short window of routes."""
import dataclasses

import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.families import FamilyCatalog
from speckv.services.scheduler.forecasts import ForecastKind, TraceFutureArrivals
from speckv.services.scheduler.policies.nowcast import nowcast_forecasts
from speckv.services.scheduler.policy_config import FamilySettings, load_policy_config
from tests.support.scheduler_scenarios import (
    CHAIN,
    FAMILY,
    ScriptedForecasts,
    heartbeat_all,
    make_core,
    route_family,
    store,
)

SETTINGS = FamilySettings(max_families=16, max_chain_blocks=6, heat_window_s=10.0, prompt_ewma_alpha=0.5,
                          recent_window_s=1.0, surge_min_routes=3)
A, B, N = Family("a"), Family("b"), NodeId("n0")


def catalog_with(routes: list[tuple[float, Family]]) -> FamilyCatalog:
    catalog = FamilyCatalog(SETTINGS)
    for t, family in routes:
        catalog.observe(family, [1, 2], 32, N, t)
    return catalog


def test_surging_counts_routes_within_the_recent_window_only():
    catalog = catalog_with([(0.0, A), (0.3, A), (0.6, A), (0.9, A), (0.95, B), (0.99, B)])
    assert catalog.surging(0.99, 1) == [(A, 4), (B, 2)]
    assert catalog.surging(1.0, 1) == [(A, 3), (B, 2)]  # the route at 0.0 is a full second old: out
    assert catalog.surging(1.0, 3) == [(A, 3)]
    assert catalog.surging(2.0, 1) == []  # everything left the window
    assert catalog.heat(A, 2.0) == 4  # the heat window (10 s) still counts them


@pytest.mark.parametrize("min_routes, horizon_s, expected", [
    (3, 2.0, {A: 6.0}),  # 3 routes in the last second, kept up over 2 s
    (3, 5.0, {A: 15.0}),
    (2, 2.0, {A: 6.0, B: 4.0}),
    (4, 2.0, {}),
])
def test_nowcast_is_the_recent_rate_over_the_horizon(min_routes, horizon_s, expected):
    catalog = catalog_with([(0.0, A), (0.3, A), (0.6, A), (0.9, A), (0.95, B), (0.99, B)])
    forecasts = nowcast_forecasts(catalog.surging(1.0, min_routes), horizon_s, 1.0)
    assert {f.family: f.expected_count for f in forecasts} == pytest.approx(expected)
    assert all(f.kind is ForecastKind.BURST and f.horizon_s == horizon_s
               and f.upper_quantile == f.expected_count for f in forecasts)


def _burst_in_progress(policy: str, forecasts=None, future=None, **overrides):
    """n0 holds the family's prefix; 200 of its requests were routed in the
    last second and the predictor forecasts nothing."""
    planner = {"horizon_s": 1.0, "plan_every_s": 0.0, **overrides}
    core, clock = make_core(4, policy, forecasts, future=future, planner=planner)
    store(core, "n0", CHAIN)
    heartbeat_all(core, 4)
    route_family(core, 200)
    return core


def test_predictive_replicates_for_a_burst_the_predictor_has_not_seen():
    forecasts = ScriptedForecasts()  # forecasts nothing
    core = _burst_in_progress("predictive", forecasts)
    orders = core.tick()
    assert forecasts.calls >= 1 and orders
    assert {o.spec.family for o in orders} == {FAMILY} and {o.spec.source for o in orders} == {"n0"}
    assert all(o.spec.expected_benefit_ms > 0 and o.spec.policy == "predictive" for o in orders)


def test_no_nowcast_no_order_and_the_oracle_gets_none():
    assert _burst_in_progress("predictive", ScriptedForecasts(), nowcast_min_routes=0).tick() == []
    oracle = _burst_in_progress("oracle", future=TraceFutureArrivals([], 100.0))
    assert oracle.tick() == []  # nothing in its future: the past second's burst is not its evidence


def test_routes_of_requests_that_arrived_long_ago_are_no_burst():
    catalog = FamilyCatalog(SETTINGS)
    for i in range(50):  # a warm start: history routed within a second of now
        catalog.observe(A, [1, 2], 32, N, 100.0 + i / 100, arrival_s=40.0 + i)
    catalog.observe(B, [1, 2], 32, N, 100.6, arrival_s=100.2)  # arrived 0.4 s ago: recent
    assert catalog.surging(100.6, 1) == [(B, 1)]
    assert catalog.heat(A, 100.6) == 50  # still heat: the heat window counts routes


def _surge_growing(factor: float):
    """A regular plan sees 3 routes of the family (the holder serves them: no
    order), then 197 more arrive before the next regular plan (100 s away)."""
    forecasts = ScriptedForecasts()
    core, _ = make_core(4, "predictive", forecasts,
                        planner={"horizon_s": 1.0, "plan_every_s": 100.0, "surge_replan_factor": factor})
    store(core, "n0", CHAIN)
    heartbeat_all(core, 4)
    route_family(core, 3)
    assert core.tick() == []  # the regular plan: three hits fit on the holder
    route_family(core, 197)
    return core, forecasts


def test_a_surge_that_grew_past_the_factor_is_planned_at_the_next_tick_on_the_forecasts_in_hand():
    core, forecasts = _surge_growing(2.0)
    calls = forecasts.calls
    orders = core.tick()
    assert orders and {o.spec.family for o in orders} == {FAMILY}
    assert forecasts.calls == calls  # no new fetch: the last forecasts, with the nowcast of now
    assert core.tick() == []  # planned at 200 routes: no growth since


def test_without_the_factor_a_grown_surge_waits_for_the_regular_plan():
    core, _ = _surge_growing(0.0)
    assert core.tick() == []


@pytest.mark.parametrize("factor", [0.5, 1.0, -2.0, float("nan")])
def test_a_replan_factor_that_is_not_off_or_above_one_is_refused(factor):
    config = load_policy_config()
    bad = dataclasses.replace(config, planner=dataclasses.replace(config.planner, surge_replan_factor=factor))
    with pytest.raises(InvalidArgument, match="surge_replan_factor"):
        bad.validate()


def test_the_lead_keeps_the_recent_rate_up_past_the_horizon():
    catalog = catalog_with([(0.0, A), (0.3, A), (0.6, A), (0.9, A)])
    (f,) = nowcast_forecasts(catalog.surging(1.0, 3), 2.0, 1.0, lead_s=2.0)
    assert f.horizon_s == 4.0 and f.expected_count == pytest.approx(12.0)  # 3 a second over 2 + 2 s


def test_a_copy_that_lands_after_the_horizon_is_bought_only_with_the_lead():
    """A 128-block copy takes longer than a 50 ms horizon to land: without a
    lead it serves none of the demand priced and is worth nothing, however
    long the holder's queue; with one it meets the burst it would still find."""
    without = _burst_in_progress("predictive", ScriptedForecasts(), horizon_s=0.05)
    assert without.tick() == []
    core = _burst_in_progress("predictive", ScriptedForecasts(), horizon_s=0.05, nowcast_lead_s=1.0)
    orders = core.tick()
    assert orders and {o.spec.family for o in orders} == {FAMILY}
    assert all(o.spec.expected_benefit_ms > 0 and o.spec.source == "n0" for o in orders)


@pytest.mark.parametrize("lead", [-1.0, float("inf"), float("nan")])
def test_a_lead_that_is_not_finite_and_not_negative_is_refused(lead):
    config = load_policy_config()
    bad = dataclasses.replace(config, planner=dataclasses.replace(config.planner, nowcast_lead_s=lead))
    with pytest.raises(InvalidArgument, match="nowcast_lead_s"):
        bad.validate()
