from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.rpc.server import ServerSettings


@dataclass(frozen=True, slots=True)
class DemoConfig(ServerSettings):
    node_id: str = field(default="node-0", metadata={"help": "id"})
    ratio: float = field(default=1.5, metadata={"help": "a ratio"})
    verbose: bool = field(default=False, metadata={"help": "talk more"})

    def validate(self) -> None:
        ServerSettings.validate(self)
        if not self.node_id:
            raise InvalidArgument("node_id must not be empty")


def test_defaults_when_nothing_given():
    config = parse_config(DemoConfig, [], {}, prog="t")
    assert (config.port, config.node_id, config.ratio, config.verbose) == (0, "node-0", 1.5, False)


@pytest.mark.parametrize(
    "argv, environ, expected",
    [
        (["--port", "7000"], {"SPECKV_PORT": "8000"}, 7000),  # flag beats variable
        ([], {"SPECKV_PORT": "8000"}, 8000),  # variable beats default
        ([], {"SPECKV_PORTS": "8000"}, 0),  # unrelated variables ignored
    ],
)
def test_precedence(argv, environ, expected):
    assert parse_config(DemoConfig, argv, environ, prog="t").port == expected


def test_bool_and_float_from_environment():
    config = parse_config(DemoConfig, [], {"SPECKV_VERBOSE": "yes", "SPECKV_RATIO": "0.25"}, prog="t")
    assert config.verbose is True and config.ratio == 0.25


@pytest.mark.parametrize(
    "argv, environ, fragment",
    [
        (["--port", "70000"], {}, "port=70000"),
        (["--port", "eighty"], {}, "--port='eighty'"),
        ([], {"SPECKV_RATIO": "fast"}, "SPECKV_RATIO='fast'"),
        ([], {"SPECKV_VERBOSE": "maybe"}, "SPECKV_VERBOSE"),
        (["--node-id", ""], {}, "node_id must not be empty"),
        (["--grace-s", "0"], {}, "grace_s=0.0"),
    ],
)
def test_invalid_values_name_the_setting(argv, environ, fragment):
    with pytest.raises(InvalidArgument, match=fragment.replace("(", r"\(").replace("?", r"\?")):
        parse_config(DemoConfig, argv, environ, prog="t")
