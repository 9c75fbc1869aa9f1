"""EngineLiveness: an engine is dead only after `failures` probes in a row
fail, comes back (once) at the next answer, and is probed every interval of
the injected clock."""
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.scheduler.engine_liveness import EngineLiveness, Health, LivenessRule, Transition

RULE = LivenessRule(interval_s=1.0, timeout_s=0.5, failures=3)


def machine(rule=RULE):
    clock = ManualClock(100.0)
    return EngineLiveness(rule, clock), clock


def record(liveness, clock, answers):
    outcomes = []
    for answered in answers:
        clock.advance(liveness.wait_s())
        outcomes.append(liveness.record(answered))
    return outcomes


def test_dead_only_after_the_configured_failures_in_a_row():
    liveness, clock = machine()
    record(liveness, clock, [True, False, False, True, False, False])  # never three in a row
    assert liveness.health is Health.SUSPECT and liveness.deaths == 0
    died = record(liveness, clock, [False])[0]
    assert (died.transition, died.health, died.failures) == (Transition.DIED, Health.DEAD, 3)
    assert died.ever_answered and died.silent_s == pytest.approx(3.0)  # the last answer was three probes ago
    assert [o.transition for o in record(liveness, clock, [False, False])] == [Transition.NONE] * 2
    assert liveness.deaths == 1 and not liveness.health.served


def test_a_suspect_engine_is_still_served_and_an_answer_clears_it():
    liveness, clock = machine()
    record(liveness, clock, [True, False, False])
    assert liveness.health is Health.SUSPECT and liveness.health.served
    record(liveness, clock, [True])
    assert liveness.health is Health.ALIVE
    assert record(liveness, clock, [False, False])[-1].transition is Transition.NONE  # the count started over


def test_a_dead_engine_revives_once_at_its_next_answer():
    liveness, clock = machine()
    record(liveness, clock, [True, False, False, False])
    outcomes = record(liveness, clock, [True, True])
    assert [o.transition for o in outcomes] == [Transition.REVIVED, Transition.NONE]
    assert liveness.health is Health.ALIVE and (liveness.deaths, liveness.revivals) == (1, 1)
    assert record(liveness, clock, [False, False, False])[-1].transition is Transition.DIED  # and can die again
    assert liveness.deaths == 2


def test_an_engine_that_never_answers_is_served_until_it_is_declared_dead():
    liveness, clock = machine()
    first = record(liveness, clock, [False, False])
    assert liveness.health is Health.UNKNOWN and all(o.health.served for o in first)
    died = record(liveness, clock, [False])[0]
    assert died.transition is Transition.DIED and not died.ever_answered
    assert died.silent_s == pytest.approx(2.0)  # counted from construction: the first probe is due at once


def test_probes_are_due_every_interval_of_the_injected_clock():
    liveness, clock = machine(LivenessRule(interval_s=2.5, failures=1))
    assert liveness.wait_s() == 0.0
    liveness.record(True)
    assert liveness.wait_s() == pytest.approx(2.5)
    clock.advance(1.0)
    assert liveness.wait_s() == pytest.approx(1.5)
    clock.advance(5.0)
    assert liveness.wait_s() == 0.0
    assert liveness.record(False).transition is Transition.DIED  # failures=1: the first failure kills


@pytest.mark.parametrize("kwargs", [{"interval_s": 0.0}, {"timeout_s": -1.0}, {"failures": 0}])
def test_a_rule_that_could_not_work_is_refused(kwargs):
    with pytest.raises(ValueError):
        LivenessRule(**kwargs)
