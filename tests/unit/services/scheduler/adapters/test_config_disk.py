"""The scheduler's disk-load pricing flags: parsed, checked, and carried to the core."""
from __future__ import annotations

import pytest

from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.server import core_settings


def parse(*argv: str) -> SchedulerConfig:
    return parse_config(SchedulerConfig, list(argv), {}, prog="speckv scheduler")


def test_disk_is_unpriced_by_default_and_the_flags_reach_the_core():
    assert (parse().disk_gbps, parse().disk_overhead_ms) == (0.0, 0.0)
    config = parse("--host-link-gbps", "400", "--disk-gbps", "41.6", "--disk-overhead-ms", "0.09")
    settings = core_settings(config)
    assert (settings.disk_gbps, settings.disk_overhead_ms) == (41.6, 0.09)


def test_a_negative_figure_or_a_disk_without_a_host_link_is_refused():
    with pytest.raises(InvalidArgument, match="disk_gbps=-1.0"):
        parse("--host-link-gbps", "400", "--disk-gbps", "-1")
    with pytest.raises(InvalidArgument, match="needs host_link_gbps > 0"):
        parse("--disk-gbps", "41.6")
