"""`speckv up --metrics-port-base`: one /metrics port per service."""
from __future__ import annotations

import pytest

from speckv.services.cluster.launcher import metrics_ports
from speckv.services.cluster.up import parse_spec
from speckv.services.common.errors import InvalidArgument


def test_each_service_gets_its_own_port_from_the_base():
    assert metrics_ports(9400, 3) == {"predictor": 9400, "scheduler": 9401, "node-0": 9402, "node-1": 9403,
                                      "node-2": 9404}


def test_base_zero_is_off():
    assert metrics_ports(0, 3) == {}


def test_the_ports_must_fit():
    assert metrics_ports(65535 - 4, 3)["node-2"] == 65535
    with pytest.raises(InvalidArgument):
        metrics_ports(65535 - 3, 3)


def test_up_takes_the_base_and_is_off_by_default():
    assert parse_spec([], {})[0].metrics_port_base == 0
    assert parse_spec(["--metrics-port-base", "9400"], {})[0].metrics_port_base == 9400
