"""RoutingClient given a target list with `dns:` entries (services/client/
replica_set.py) against real schedulers on loopback: a name the system
resolver answers (localhost) is dialled and asked; replicas that join the
name's records are asked too, a stopped one is passed over for another with
no request falling back, and one the records drop is let go after the grace.

The second test's name is answered by `records` (the addresses a DNS server
would return, changed by the test) through TargetWatcher's resolve hook;
the schedulers, channels and calls are real."""
from __future__ import annotations

import collections
import threading

import pytest

from speckv.services.client.routing import ClientSettings, Discovery, RouteSource, RoutingClient
from speckv.services.cluster.ports import free_ports
from speckv.services.common.errors import InvalidArgument
from tests.support.scheduler_service import register, scheduler
from tests.support.waiting import wait_until

GRACE_S = 0.3


def tally(client: RoutingClient, prefix: str, count: int = 30) -> collections.Counter:
    seen: collections.Counter = collections.Counter()
    for i in range(count):
        routed = client.route(f"{prefix}{i}", [], 16)
        seen[routed.node_id if routed.source is RouteSource.SCHEDULER else "fallback"] += 1
        client.done(f"{prefix}{i}")
    return seen


def test_a_dns_entry_the_system_resolver_answers_is_dialled_and_asked():
    port = free_ports(1)[0]
    with scheduler(policy="none", port=port, host="127.0.0.1", confirm_routes=False) as (_, stub):
        register(stub, "n1", "127.0.0.1:1")
        client = RoutingClient(f"dns:localhost:{port}")
        try:
            assert client.replica_addresses() == (f"127.0.0.1:{port}",)  # resolved before the first route
            assert tally(client, "a") == {"n1": 30}
        finally:
            client.close()
        assert client.replica_addresses() == ()  # the client's own channels are closed


def test_replicas_joining_and_leaving_the_name_are_followed_without_a_fallback():
    records: list[str] = []
    lock = threading.Lock()

    def resolve(name: str, port: int) -> list[str]:
        assert (name, port) == ("schedulers.test", 50052)
        with lock:
            return list(records)

    with scheduler(policy="none", confirm_routes=False) as (server_a, a), \
            scheduler(policy="none", confirm_routes=False) as (server_b, b):
        register(a, "na", "127.0.0.1:1")  # who answered shows in the node named
        register(b, "nb", "127.0.0.1:2")
        records[:] = [server_a.address]
        client = RoutingClient("dns:schedulers.test:50052", settings=ClientSettings(deadline_s=2.0),
                               discovery=Discovery(interval_s=0.05, grace_s=GRACE_S, resolve=resolve))
        try:
            assert client.replica_addresses() == (server_a.address,)
            assert tally(client, "a") == {"na": 30}

            with lock:
                records[:] = [server_a.address, server_b.address]
            assert wait_until(lambda: len(client.replica_addresses()) == 2)
            assert set(tally(client, "b")) == {"na", "nb"}  # spread over both

            server_a.stop(grace_s=0.0)  # a replica dies while the name still lists it
            assert tally(client, "c") == {"nb": 30}  # asked of the other within the request: none falls back
            with lock:
                records[:] = [server_b.address]
            assert wait_until(lambda: client.replica_addresses() == (server_b.address,))
            counters = client.counters()
            assert counters.routes_fallback == 0 and counters.routes_retried >= 1
        finally:
            client.close()


@pytest.mark.parametrize("spec", ["", "dns:nameonly", "hostwithoutport"])
def test_a_bad_target_list_is_refused_naming_it(spec):
    with pytest.raises(InvalidArgument, match="scheduler"):
        RoutingClient(spec)
