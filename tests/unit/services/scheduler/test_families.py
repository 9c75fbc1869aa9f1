from __future__ import annotations

import pytest

from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.families import FamilyCatalog
from speckv.services.scheduler.policy_config import FamilySettings

SETTINGS = FamilySettings(max_families=16, max_chain_blocks=6, heat_window_s=10.0, prompt_ewma_alpha=0.5,
                          recent_window_s=1.0, surge_min_routes=3)
F, N = Family("conv"), NodeId("n0")


def chain_after(*requests: list[int]) -> list[int]:
    catalog = FamilyCatalog(SETTINGS)
    for t, hashes in enumerate(requests):
        catalog.observe(F, hashes, 512 * len(hashes), N, float(t))
    return catalog.profile(F).chain


@pytest.mark.parametrize(
    "requests, expected",
    [
        (([1, 2], [1, 2, 3, 4]), [1, 2, 3, 4]),  # a conversation's next turn extends the chain
        (([1, 2, 3], [1, 2, 3, 4, 5, 6, 7, 8]), [1, 2, 3, 4, 5, 6]),  # capped at max_chain_blocks
        (([1, 2, 3], [1, 2, 9]), [1, 2]),  # a diverging suffix cuts to the common prefix
        (([1, 2, 3], [1, 2]), [1, 2]),  # a shorter request cuts too
        (([1, 2, 3], [1, 2, 9], [1, 2, 9, 10]), [1, 2]),  # once diverged, a shared prefix never grows again
    ],
)
def test_chain_follows_continuations_and_cuts_on_divergence(requests, expected):
    assert chain_after(*requests) == expected


def test_node_route_rates_count_routes_in_the_heat_window():
    from speckv.services.common.ids import NodeId
    from speckv.services.scheduler.families import FamilyCatalog
    from speckv.services.scheduler.policy_config import load_policy_config
    settings = load_policy_config().families  # heat_window_s 10
    catalog = FamilyCatalog(settings)
    for t in range(5):
        catalog.observe("f", [1, 2], 32, NodeId("a"), float(t))
    catalog.observe("g", [3], 16, NodeId("b"), 4.0)
    assert catalog.node_route_rates(4.0) == {"a": 5 / settings.heat_window_s, "b": 1 / settings.heat_window_s}
    assert catalog.node_route_rates(14.5) == {}  # all out of the window


def _routes(catalog, times, family=F, arrival_lag_s=0.0):
    for t in times:
        catalog.observe(family, [1, 2], 1024, N, t, arrival_s=t - arrival_lag_s)


def test_a_family_that_never_surged_has_no_surge_history():
    catalog = FamilyCatalog(SETTINGS)
    _routes(catalog, [0.0, 0.5, 2.0, 2.9])  # never 3 within a second
    assert catalog.surge_history(F, 3.0) is None
    assert catalog.surge_history(Family("unknown"), 3.0) is None


def test_each_surge_counts_once_with_its_peak():
    catalog = FamilyCatalog(SETTINGS)
    _routes(catalog, [10.0])  # first live route: observed from here
    _routes(catalog, [20.0, 20.1, 20.2, 20.3])  # a surge peaking at 4 within a second
    now = catalog.surge_history(F, 20.35)
    assert (now.surges, now.mean_peak, now.surging) == (1, 4.0, True)
    _routes(catalog, [30.0, 30.1, 30.2, 30.3, 30.4, 30.5])  # a second surge, peak 6
    later = catalog.surge_history(F, 40.0)
    assert (later.surges, later.mean_peak, later.surging) == (2, 5.0, False)
    assert later.observed_s == pytest.approx(30.0)


def test_routes_of_a_warm_start_neither_surge_nor_start_the_observation():
    catalog = FamilyCatalog(SETTINGS)
    _routes(catalog, [5.0, 5.0, 5.0, 5.0], arrival_lag_s=100.0)  # history replayed at once
    assert catalog.surge_history(F, 5.0) is None
    assert catalog.profile(F).first_recent is None
