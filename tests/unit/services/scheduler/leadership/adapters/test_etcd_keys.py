"""EtcdKeys' own logic: endpoints and prefix ranges (its calls against a real
etcd: tests/services/test_scheduler_leadership.py)."""
from __future__ import annotations

import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.scheduler.leadership.adapters.etcd_keys import _next_prefix, parse_endpoint


@pytest.mark.parametrize("endpoint, expected", [
    ("http://127.0.0.1:2379", ("127.0.0.1", 2379)),
    ("127.0.0.1:2379", ("127.0.0.1", 2379)),
    ("etcd.local:12", ("etcd.local", 12)),
    ("http://[::1]:2379/", ("::1", 2379)),
])
def test_endpoints_parse(endpoint, expected):
    assert parse_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["", "127.0.0.1", "https://h:1", "http://h:x", "http://h:1/v3", "h:99999"])
def test_bad_endpoints_are_refused_naming_them(endpoint):
    with pytest.raises(InvalidArgument, match="etcd endpoint"):
        parse_endpoint(endpoint)


def test_a_prefix_range_ends_past_every_key_with_the_prefix():
    assert _next_prefix("/speckv/c/state/") == b"/speckv/c/state0"
    assert _next_prefix("a\xff") == "a\xff".encode()[:-1] + b"\xc0"
