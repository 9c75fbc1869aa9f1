"""A replica's worth against its family's next surge (insurance.py), on
hand-computed cases, and through the planner (`predictive`)."""
import math

import pytest

from speckv.services.scheduler.families import SurgeHistory
from speckv.services.scheduler.replication.insurance import insurance_ms, surge_demand, surge_probability
from speckv.services.scheduler.replication.value import Demand, ServeOption
from tests.support.scheduler_scenarios import (
    CHAIN,
    FAMILY,
    ScriptedForecasts,
    heartbeat_all,
    make_core,
    route_family,
    store,
)


@pytest.mark.parametrize("surges, observed_s, life_s, expected", [
    (2, 300.0, 60.0, 1 - math.exp(-0.4)),  # 2 surges in 300 s: 0.4 expected within 60 s
    (1, 10.0, 60.0, 1 - math.exp(-1.0)),  # seen for 10 s only: counted over the 60 s insured
    (3, 300.0, 0.0, 0.0),  # no life insured
])
def test_the_chance_of_another_surge_within_the_life_insured(surges, observed_s, life_s, expected):
    history = SurgeHistory(surges, 5.0, observed_s, False)
    assert surge_probability(history, life_s) == pytest.approx(expected)


def test_a_surge_is_its_mean_peak_rate_over_the_horizon():
    assert surge_demand(SurgeHistory(2, 5.0, 300.0, False), 1.0, 2.0) == Demand(10.0, 2000.0)


def test_a_second_holder_is_worth_the_queueing_it_spares_the_surge_times_its_chance():
    """10 requests 200 ms apart, 400 ms of prefill each: on one holder the
    k-th waits 200 k ms (sum of TTFT 10 x 400 + 200 x 45 = 13,000 ms); with a
    second holder each takes the free one (4,000 ms). At p = 0.25: 2,250 ms."""
    holder, copy = ServeOption("h", 0.0, 0.0, 400.0), ServeOption("c", 0.0, 0.0, 400.0)
    assert insurance_ms([holder], copy, Demand(10.0, 2000.0), 0.25) == pytest.approx(0.25 * 9000.0)
    assert insurance_ms([holder], copy, Demand(10.0, 2000.0), 0.0) == 0.0
    assert insurance_ms([holder, copy], ServeOption("d", 0.0, 0.0, 400.0), Demand(1.0, 2000.0), 1.0) == 0.0


def _after_a_surge(life_s: float, surging_now: bool):
    """n0 holds the family; it surged once (200 routes within a second at
    100 s: the holder serves 64 a second from cache), and one request is
    forecast now that its idle holder serves at once: nothing to gain
    within the lease."""
    forecasts = ScriptedForecasts()
    core, clock = make_core(4, "predictive", forecasts, planner={"horizon_s": 2.0, "plan_every_s": 0.0,
                                                                "insurance_life_s": life_s})
    store(core, "n0", CHAIN)
    route_family(core, 200)  # at 100 s, all within the recent window: one surge, peak 200
    if not surging_now:
        clock.advance(120.0)
    heartbeat_all(core, 4)
    forecasts.counts = {FAMILY: 1.0}
    return core


def test_a_family_that_surged_gets_a_standing_copy_leased_for_the_life_insured():
    orders = _after_a_surge(60.0, surging_now=False).tick()
    assert orders and all(o.spec.source == "n0" and o.spec.lease_ms == 60_000 for o in orders)
    assert all(o.spec.expected_benefit_ms > 0 for o in orders)


def test_no_insurance_when_off():
    assert _after_a_surge(0.0, surging_now=False).tick() == []  # the idle holder serves the one request


def test_no_insurance_while_the_family_surges():
    """In the surge its forecasts price it (here one request: nothing)."""
    assert all(o.spec.lease_ms == 15_000 for o in _after_a_surge(60.0, surging_now=True).tick())
