"""EtcdKeys' own logic: endpoints and prefix ranges (its calls against a real
etcd: tests/services/test_scheduler_leadership.py, test_scheduler_etcd_members.py)."""
from __future__ import annotations

from speckv.services.scheduler.leadership.adapters.etcd_keys import EtcdKeys, _next_prefix


def test_a_prefix_range_ends_past_every_key_with_the_prefix():
    assert _next_prefix("/speckv/c/state/") == b"/speckv/c/state0"
    assert _next_prefix("a\xff") == "a\xff".encode()[:-1] + b"\xc0"


def test_the_keys_name_every_member_once_in_order():
    keys = EtcdKeys("h2:2379, http://h1:2379,h2:2379")
    assert keys.endpoint == "http://h2:2379,http://h1:2379"
    assert [m.host for m in keys.members] == ["h2", "h1"]
