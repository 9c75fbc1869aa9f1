"""The scheduler's limit fields (docs/limits.md) are validated at startup."""
from __future__ import annotations

import pytest

from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument
from speckv.services.scheduler.adapters.config import SchedulerConfig


def parse(*argv: str) -> SchedulerConfig:
    return parse_config(SchedulerConfig, list(argv), {}, prog="speckv scheduler")


def test_limit_defaults_and_flags():
    assert (parse().max_prompt_tokens, parse().max_family_chars) == (262_144, 256)
    assert parse("--max-prompt-tokens", "8192").max_prompt_tokens == 8192


@pytest.mark.parametrize("field", ["max_prompt_tokens", "max_family_chars"])
def test_limits_must_be_positive(field):
    with pytest.raises(InvalidArgument, match=field):
        parse("--" + field.replace("_", "-"), "0")


def test_engine_health_probing_defaults_and_refusals():
    rule = parse().engine_health()
    assert (rule.interval_s, rule.timeout_s, rule.failures) == (1.0, 2.0, 3)
    assert parse("--engine-health-failures", "5").engine_health().failures == 5
    for flag, value in (("--engine-health-interval-s", "0"), ("--engine-health-timeout-s", "-1"),
                        ("--engine-health-failures", "0")):
        with pytest.raises(InvalidArgument, match="engine_health"):
            parse(flag, value)
