"""The planner's currency on hand-computed cases (value.py)."""
import math

import pytest

from speckv.services.scheduler.replication.value import (
    MAX_PRICED_REQUESTS,
    ActionValue,
    Demand,
    ServeOption,
    eviction_ms,
    link_delay_ms,
    saving_ms,
    served_ttft_ms,
)


def test_one_request_waits_for_nothing_once_the_queue_drained():
    # Arrives at 500 ms (the middle of 1 s); the 100 ms queue is gone by then.
    assert served_ttft_ms([ServeOption("a", 100.0, 0.0, 50.0)], Demand(1, 1000.0)) == pytest.approx(50.0)


def test_requests_of_a_burst_queue_behind_each_other():
    # Eight requests in 800 ms, at 50, 150, ... 750 ms; each holds the node
    # for 100 ms, so each starts just as the one before ends: no wait.
    holder = ServeOption("a", 0.0, 0.0, 100.0)
    assert served_ttft_ms([holder], Demand(8, 800.0)) == pytest.approx(800.0)
    # In 400 ms they queue: arrivals 25, 75, ...; starts 25, 125, 225, ...:
    # the k-th (from 0) waits 50 k ms: 8 x 100 + 50 x (0 + 1 + ... + 7).
    assert served_ttft_ms([holder], Demand(8, 400.0)) == pytest.approx(800.0 + 50.0 * 28)
    # A node recomputing in 120 ms takes a request whenever the holder's
    # wait would pass 20 ms: arrivals 25 (a: 100), 75 (a waits 50: b, 120),
    # 125 (a free at 125: 100), 175 (b free at 195, a at 225: b waits 20, 140),
    # 225 (a: 100), 275 (a at 325, b at 315: b, 160)... as walked:
    other = ServeOption("b", 0.0, 0.0, 120.0)
    both = served_ttft_ms([holder, other], Demand(8, 400.0))
    assert both < served_ttft_ms([holder], Demand(8, 400.0))
    assert saving_ms([holder], [other], Demand(8, 400.0)) == pytest.approx(
        served_ttft_ms([holder], Demand(8, 400.0)) - both)


def test_a_fractional_request_counts_by_its_probability_over_its_whole_window():
    option = ServeOption("a", 0.0, 20.0, 80.0)
    assert served_ttft_ms([option], Demand(0.25, 1000.0)) == pytest.approx(0.25 * 100.0)
    assert Demand(2.5, 400.0).arrivals() == [(50.0, 0.625), (150.0, 0.625), (250.0, 0.625), (350.0, 0.625)]
    # A holder busy for the first 2 s of an 8 s window: a return at 1 s
    # waits 1 s, one at 3, 5 or 7 s does not. P(return) = 0.4 spread over
    # four points of 0.1: 0.1 x (1000 + 50) + 0.3 x 50.
    busy = ServeOption("a", 2000.0, 0.0, 50.0)
    assert served_ttft_ms([busy], Demand(0.4, 8000.0)) == pytest.approx(0.1 * 1050.0 + 0.3 * 50.0)


def test_pulls_from_one_source_take_turns_on_its_link():
    # Arrivals at 5, 15, 25 and 35 ms, pulls of 40 ms from "s" to idle
    # nodes, then 10 ms of prefill: the first pulls 5..45 (TTFT 45 - 5 + 10
    # = 50); the others wait for the link: 45..85 (TTFT 80), 85..125 (110),
    # 125..165 (140).
    pulls = [ServeOption("b", 0.0, 0.0, 10.0, pull_ms=40.0, pull_link="s"),
             ServeOption("c", 0.0, 0.0, 10.0, pull_ms=40.0, pull_link="s")]
    assert served_ttft_ms(pulls, Demand(4, 40.0)) == pytest.approx(50.0 + 80.0 + 110.0 + 140.0)


def test_an_option_not_ready_serves_only_later_arrivals():
    recompute = ServeOption("b", 0.0, 0.0, 90.0)
    replica = ServeOption("c", 0.0, 0.0, 15.0, ready_ms=200.0)
    # Four requests at 50, 150 (recompute: 90 each), 250, 350 (the replica
    # has landed: 15 each).
    assert served_ttft_ms([recompute, replica], Demand(4, 400.0)) == pytest.approx(210.0)


def test_a_joinable_option_makes_earlier_arrivals_wait_for_it():
    """A stage's read landing at 200 ms (joins): the requests at 50 and 150
    wait for it (200 - 50 + 15; the second also behind the first's 15 ms
    prefill: 215 - 150 + 15) rather than skip it, those at 250 and 350 take
    it at once; a lone joinable option is enough."""
    stage = ServeOption("c", 0.0, 0.0, 15.0, ready_ms=200.0, joins=True)
    assert served_ttft_ms([stage], Demand(4, 400.0)) == pytest.approx(165.0 + 80.0 + 15.0 + 15.0)
    recompute = ServeOption("b", 0.0, 0.0, 90.0)
    assert served_ttft_ms([recompute, stage], Demand(4, 400.0)) == pytest.approx(90.0 + 65.0 + 15.0 + 15.0)


def test_some_option_must_be_ready_at_once():
    with pytest.raises(ValueError):
        served_ttft_ms([ServeOption("c", 0.0, 0.0, 15.0, ready_ms=1.0)], Demand(1, 100.0))


def test_a_huge_burst_is_walked_in_at_most_the_cap_of_requests():
    arrivals = Demand(10 * MAX_PRICED_REQUESTS, 1000.0).arrivals()
    assert len(arrivals) == MAX_PRICED_REQUESTS
    assert sum(w for _, w in arrivals) == pytest.approx(10 * MAX_PRICED_REQUESTS)
    assert Demand(0.0, 1000.0).arrivals() == []


@pytest.mark.parametrize("blocks, p, cost, expected", [
    (10, 0.3, 20.0, 60.0),
    (0, 0.9, 20.0, 0.0),
    (-3, 0.9, 20.0, 0.0),  # no block pushed out
    (10, 1.5, 2.0, 20.0),  # a probability above 1 counts as 1
])
def test_eviction_loss_is_blocks_times_reuse_times_cost(blocks, p, cost, expected):
    assert eviction_ms(blocks, p, cost) == pytest.approx(expected)


def test_link_delay_is_half_the_transfer_for_every_pull_arriving_during_it():
    # 2.5 pulls/s over a 100 ms transfer: 0.25 pulls, each waiting 50 ms.
    assert link_delay_ms(100.0, [2.0, 0.5]) == pytest.approx(12.5)
    assert link_delay_ms(100.0, []) == 0.0


def test_net_is_saving_minus_losses_and_admits_only_a_gain():
    assert ActionValue(100.0, 60.0, 30.0).net_ms == pytest.approx(10.0)
    assert ActionValue(100.0, 60.0, 30.0).admitted
    assert not ActionValue(80.0, 60.0, 20.0).admitted
    assert not math.isnan(ActionValue(0.0, 0.0, 0.0).net_ms)


def test_the_queue_externality_charges_work_drawn_to_a_busy_node_and_credits_work_taken_off():
    from speckv.services.scheduler.replication.value import queue_externality_ms
    before, after = {"a": 100.0, "b": 50.0}, {"a": 300.0, "b": 0.0}
    rates = {"a": 4.0, "b": 2.0}
    # a: +200 ms of work, 4 routes/s: 4 x 0.2 s x 100 ms = 80 ms; b: -50 ms at 2/s: -(2 x 0.05 x 25) = -2.5 ms
    assert queue_externality_ms(before, after, rates) == pytest.approx(80.0 - 2.5)
    assert queue_externality_ms(before, before, rates) == 0.0
    assert queue_externality_ms(before, after, {}) == 0.0
