from __future__ import annotations

import pytest

from speckv.services.common.ids import Family, NodeId
from speckv.services.scheduler.families import FamilyCatalog
from speckv.services.scheduler.policy_config import FamilySettings

SETTINGS = FamilySettings(max_families=16, max_chain_blocks=6, heat_window_s=10.0, prompt_ewma_alpha=0.5,
                          recent_window_s=1.0)
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
