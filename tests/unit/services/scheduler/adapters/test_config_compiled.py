"""The scheduler's --compiled choice (adapters/compiled_start.py) is validated at startup."""
from __future__ import annotations

import pytest

from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument
from speckv.services.scheduler.adapters.config import SchedulerConfig


def parse(*argv: str, environ: dict[str, str] | None = None) -> SchedulerConfig:
    return parse_config(SchedulerConfig, list(argv), environ or {}, prog="speckv scheduler")


def test_auto_by_default_and_settable_by_flag_or_environment():
    assert (parse().compiled, parse().compiled_dir) == ("auto", "")
    assert parse("--compiled", "off", "--compiled-dir", "/x").compiled_dir == "/x"
    assert parse(environ={"SPECKV_COMPILED": "on"}).compiled == "on"


def test_an_unknown_mode_is_refused():
    with pytest.raises(InvalidArgument, match="compiled='always': expected one of auto, on, off"):
        parse("--compiled", "always")
