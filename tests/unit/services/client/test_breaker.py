"""The circuit breaker's states and thresholds (services/client/breaker.py), on a manual clock."""
from __future__ import annotations

import pytest

from speckv.services.client.breaker import BreakerSettings, BreakerState, CircuitBreaker
from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import InvalidArgument

OPEN_S = 2.0


def breaker(failures: int = 3) -> tuple[CircuitBreaker, ManualClock]:
    clock = ManualClock(100.0)
    return CircuitBreaker(BreakerSettings(failures_to_open=failures, open_s=OPEN_S), clock), clock


def fail(b: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        assert b.allow()
        b.record_failure()


def test_it_opens_at_exactly_failures_to_open_consecutive_failures():
    b, _ = breaker(3)
    fail(b, 2)
    assert b.state is BreakerState.CLOSED and b.allow()
    b.record_failure()
    assert b.state is BreakerState.OPEN and not b.allow() and b.opens == 1


def test_a_success_resets_the_count():
    b, _ = breaker(3)
    fail(b, 2)
    b.record_success()
    fail(b, 2)
    assert b.state is BreakerState.CLOSED


def test_open_lets_nothing_through_until_open_s_then_exactly_one_probe():
    b, clock = breaker(1)
    fail(b, 1)
    clock.advance(OPEN_S - 0.001)
    assert not b.allow() and b.state is BreakerState.OPEN
    clock.advance(0.001)
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow()  # the probe
    assert not b.allow() and not b.allow()  # everyone else falls back while it is out


def test_the_probes_success_closes_it():
    b, clock = breaker(1)
    fail(b, 1)
    clock.advance(OPEN_S)
    assert b.allow()
    b.record_success()
    assert b.state is BreakerState.CLOSED and b.allow() and b.allow()


def test_the_probes_failure_opens_it_for_another_open_s():
    b, clock = breaker(3)
    fail(b, 3)
    clock.advance(OPEN_S)
    assert b.allow()
    b.record_failure()  # one failure in HALF_OPEN suffices
    assert b.state is BreakerState.OPEN and b.opens == 2
    clock.advance(OPEN_S - 0.001)
    assert not b.allow()
    clock.advance(0.001)
    assert b.allow()


def test_a_lost_probe_is_replaced_after_open_s():
    b, clock = breaker(1)
    fail(b, 1)
    clock.advance(OPEN_S)
    assert b.allow()  # never reports back
    clock.advance(OPEN_S - 0.001)
    assert not b.allow()
    clock.advance(0.001)
    assert b.allow()


def test_a_late_failure_while_open_does_not_restart_the_wait():
    b, clock = breaker(1)
    fail(b, 1)
    clock.advance(OPEN_S - 0.5)
    b.record_failure()  # a call let through before it opened
    clock.advance(0.5)
    assert b.allow() and b.opens == 1


@pytest.mark.parametrize("kwargs", [{"failures_to_open": 0}, {"open_s": 0.0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(InvalidArgument):
        BreakerSettings(**kwargs)
