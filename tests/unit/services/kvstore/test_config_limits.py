"""The kvstore's limit fields (docs/limits.md) are validated at startup."""
from __future__ import annotations

import pytest

from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument
from speckv.services.kvstore.config import KVStoreConfig


def parse(*argv: str) -> KVStoreConfig:
    return parse_config(KVStoreConfig, list(argv), {}, prog="speckv kvstore")


def test_limit_defaults():
    config = parse()
    assert (config.max_reservation_lease_s, config.pin_lease_s, config.max_family_chars) == (60.0, 120.0, 256)
    assert (config.data_max_connections, config.data_read_timeout_s) == (64, 10.0)
    assert (config.data_unauth_max_connections, config.data_unauth_per_address, config.data_auth_timeout_s) == \
        (256, 16, 1.0)


@pytest.mark.parametrize("argv, field", [
    (["--reservation-lease-s", "61"], "max_reservation_lease_s"),  # it asks peers more than they grant
    (["--max-reservation-lease-s", "0"], "max_reservation_lease_s"),
    (["--pin-lease-s", "0"], "pin_lease_s"),
    (["--pin-lease-s", "90000"], "pin_lease_s"),
    (["--max-family-chars", "0"], "max_family_chars"),
    (["--data-max-connections", "0"], "data_max_connections"),
    (["--data-read-timeout-s", "0"], "data_read_timeout_s"),
    (["--data-unauth-max-connections", "0"], "data_unauth_max_connections"),
    (["--data-unauth-per-address", "0"], "data_unauth_per_address"),
    (["--data-auth-timeout-s", "0"], "data_auth_timeout_s"),
])
def test_bad_limits_are_refused_naming_the_field(argv, field):
    with pytest.raises(InvalidArgument, match=field):
        parse(*argv)
