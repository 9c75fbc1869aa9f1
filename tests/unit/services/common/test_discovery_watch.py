"""discovery_watch.py: rounds of resolution through an injected resolver, the
real system resolver on localhost, and a process's own addresses."""
from __future__ import annotations

import socket
import threading

from speckv.services.common.clock import ManualClock
from speckv.services.common.discovery import Changes, parse_targets
from speckv.services.common.discovery_watch import TargetWatcher, own_addresses, resolve_dns


class Zone:
    """A resolver whose answers the test sets; a missing name fails as DNS does."""

    def __init__(self):
        self.records: dict[str, list[str]] = {}
        self.asked = 0

    def __call__(self, name: str, port: int) -> list[str]:
        self.asked += 1
        if name not in self.records:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [f"{ip}:{port}" for ip in self.records[name]]


def test_rounds_report_what_joined_and_left_and_a_failure_keeps_everything():
    zone, clock, seen = Zone(), ManualClock(), []
    watcher = TargetWatcher(parse_targets("s:1,dns:peers:50052"), seen.append, name="t", resolve=zone,
                            clock=clock, grace_s=5)
    assert watcher.initial() == watcher.members() == ("s:1",)
    assert watcher.refresh() == Changes() and seen == []  # the name does not resolve yet: nothing changes
    zone.records["peers"] = ["10.0.0.1", "10.0.0.2"]
    assert watcher.refresh() == Changes(("10.0.0.1:50052", "10.0.0.2:50052"))
    assert watcher.members() == ("s:1", "10.0.0.1:50052", "10.0.0.2:50052")
    del zone.records["peers"]  # resolver outage
    clock.advance(60)
    assert watcher.refresh() == Changes() and len(watcher.members()) == 3
    zone.records["peers"] = ["10.0.0.2"]
    watcher.refresh()
    clock.advance(5)
    assert watcher.refresh() == Changes((), ("10.0.0.1:50052",))
    assert seen == [Changes(("10.0.0.1:50052", "10.0.0.2:50052")), Changes((), ("10.0.0.1:50052",))]


def test_the_thread_resolves_at_once_then_every_interval_and_stops():
    zone = Zone()
    zone.records["peers"] = ["10.0.0.1"]
    changed = threading.Event()
    watcher = TargetWatcher(parse_targets("dns:peers:7"), lambda c: changed.set(), name="t", resolve=zone,
                            interval_s=0.01).start()
    assert changed.wait(10)
    assert watcher.members() == ("10.0.0.1:7",)
    while zone.asked < 3:  # re-resolves on its own
        threading.Event().wait(0.01)
    watcher.stop()
    asked = zone.asked
    threading.Event().wait(0.05)
    assert zone.asked == asked


def test_without_dns_names_no_thread_runs():
    watcher = TargetWatcher(parse_targets("a:1"), lambda c: None, name="t", resolve=Zone()).start()
    assert watcher.refresh() == Changes() and watcher.members() == ("a:1",)
    watcher.stop()


def test_exclude_leaves_this_process_out():
    zone = Zone()
    zone.records["peers"] = ["10.0.0.1", "10.0.0.2"]
    watcher = TargetWatcher(parse_targets("dns:peers:7"), lambda c: None, name="t", resolve=zone,
                            exclude={"10.0.0.2:7"})
    watcher.refresh()
    assert watcher.members() == ("10.0.0.1:7",)


def test_the_system_resolver_on_localhost_keeps_one_family():
    addresses = resolve_dns("localhost", 50052)
    assert addresses == ["127.0.0.1:50052"]  # ::1 too on most hosts, but IPv4 wins
    assert resolve_dns("127.0.0.1", 9) == ["127.0.0.1:9"]


def test_own_addresses_resolve_names_and_a_wildcard_means_this_host():
    zone = Zone()
    zone.records[socket.gethostname()] = ["10.1.2.3"]
    zone.records["sched-a"] = ["10.1.2.4"]
    own = own_addresses(["0.0.0.0:50052", "sched-a:50052", "nowhere:1"], resolve=zone)
    assert own == {"0.0.0.0:50052", "10.1.2.3:50052", "sched-a:50052", "10.1.2.4:50052", "nowhere:1"}
