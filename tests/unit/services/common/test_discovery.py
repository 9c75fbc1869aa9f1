"""discovery.py: target lists with dns: entries, and membership over successive resolutions."""
from __future__ import annotations

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.discovery import (
    Changes,
    DnsName,
    Membership,
    Targets,
    join_host_port,
    parse_dns,
    parse_targets,
    split_host_port,
)
from speckv.services.common.errors import InvalidArgument

NAME = DnsName("speckv-scheduler-peers", 50052)


def test_static_and_dns_entries_in_order_without_blanks_or_repeats():
    targets = parse_targets(" a:1, ,dns:svc:50052,b:2,a:1,dns:///svc:50052 ")
    assert targets == Targets(("a:1", "b:2"), (DnsName("svc", 50052),))
    assert parse_targets(["a:1", "dns:svc.ns.svc.cluster.local:7"]).names == (DnsName("svc.ns.svc.cluster.local", 7),)
    assert parse_targets("").empty and not parse_targets("a:1").empty


def test_dns_forms_follow_grpc_without_an_authority():
    assert parse_dns("dns:svc:1") == parse_dns("dns:///svc:1") == DnsName("svc", 1)
    assert parse_dns("dns:[::1]:50052") == DnsName("::1", 50052)
    assert str(DnsName("svc", 1)) == "dns:svc:1"
    for bad in ("dns:svc", "dns::1", "dns:svc:0", "dns:svc:70000", "dns:svc:port", "dns:a/b:1"):
        with pytest.raises(InvalidArgument, match="expected dns:NAME:PORT"):
            parse_dns(bad)
    for authority in ("dns://8.8.8.8/svc:1", "dns://svc:1"):
        with pytest.raises(InvalidArgument, match="authority"):
            parse_dns(authority)


def test_a_static_entry_needs_a_port_and_the_error_names_the_list():
    with pytest.raises(InvalidArgument, match=r"peers: 'nohost'"):
        parse_targets("a:1,nohost", "peers")


def test_host_port_round_trip_brackets_ipv6_only():
    assert join_host_port("10.0.0.1", 5) == "10.0.0.1:5"
    assert join_host_port("fd00::1", 5) == "[fd00::1]:5"
    assert join_host_port("svc", 5) == "svc:5"
    assert split_host_port("[fd00::1]:5") == ("fd00::1", 5)
    assert split_host_port("0.0.0.0:50052") == ("0.0.0.0", 50052)
    with pytest.raises(InvalidArgument, match="advertise_address='x'"):
        split_host_port("x", "advertise_address")


def membership(grace_s=10.0, static=(), exclude=()):
    clock = ManualClock()
    return Membership(Targets(tuple(static), (NAME,)), clock, grace_s, exclude), clock


def test_addresses_join_at_once_and_leave_only_after_the_grace_period():
    m, clock = membership()
    assert m.resolved(NAME, ["10.0.0.1:50052", "10.0.0.2:50052"]) == Changes(("10.0.0.1:50052", "10.0.0.2:50052"))
    clock.advance(1)
    assert m.resolved(NAME, ["10.0.0.1:50052"]) == Changes()  # 10.0.0.2 missing since t=1
    clock.advance(9.5)
    assert not m.resolved(NAME, ["10.0.0.1:50052"])  # missing 9.5 s < 10 s: still a member
    assert m.members() == ("10.0.0.1:50052", "10.0.0.2:50052")
    clock.advance(0.5)
    assert m.resolved(NAME, ["10.0.0.1:50052", "10.0.0.3:50052"]) == Changes(("10.0.0.3:50052",), ("10.0.0.2:50052",))
    assert m.members() == ("10.0.0.1:50052", "10.0.0.3:50052")


def test_an_address_back_before_the_grace_period_ends_starts_its_clock_afresh():
    m, clock = membership(grace_s=5)
    m.resolved(NAME, ["10.0.0.1:1"])
    clock.advance(1)
    m.resolved(NAME, [])
    clock.advance(3)
    m.resolved(NAME, ["10.0.0.1:1"])  # back: no longer missing
    clock.advance(1)
    m.resolved(NAME, [])  # missing again from t=5
    clock.advance(4)
    assert m.resolved(NAME, []) == Changes()  # 4 s missing
    clock.advance(1)
    assert m.resolved(NAME, []) == Changes((), ("10.0.0.1:1",))


def test_zero_grace_removes_at_the_first_resolution_without_it():
    m, _ = membership(grace_s=0)
    m.resolved(NAME, ["a:1"])
    assert m.resolved(NAME, ["b:1"]) == Changes(("b:1",), ("a:1",))


def test_static_addresses_come_first_and_are_never_removed_by_dns():
    m, clock = membership(grace_s=0, static=("s:9", "10.0.0.1:50052"))
    assert m.members() == ("s:9", "10.0.0.1:50052")
    assert m.resolved(NAME, ["10.0.0.1:50052", "10.0.0.2:50052"]) == Changes(("10.0.0.2:50052",))
    clock.advance(1)
    assert m.resolved(NAME, []) == Changes((), ("10.0.0.2:50052",))
    assert m.members() == ("s:9", "10.0.0.1:50052")


def test_excluded_addresses_never_join():
    m, _ = membership(static=("me:1", "s:9"), exclude={"me:1", "10.0.0.9:50052"})
    assert m.members() == ("s:9",)
    assert m.resolved(NAME, ["10.0.0.9:50052", "10.0.0.1:50052"]) == Changes(("10.0.0.1:50052",))


def test_two_names_share_an_address_until_neither_lists_it():
    other = DnsName("other", 50052)
    clock = ManualClock()
    m = Membership(Targets((), (NAME, other)), clock, 0.0)
    m.resolved(NAME, ["x:50052"])
    assert m.resolved(other, ["x:50052"]) == Changes()
    assert m.resolved(NAME, []) == Changes()  # `other` still lists it
    assert m.resolved(other, []) == Changes((), ("x:50052",))


def test_negative_grace_is_refused():
    with pytest.raises(InvalidArgument):
        Membership(Targets(), ManualClock(), -1)
