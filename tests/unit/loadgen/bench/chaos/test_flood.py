"""The chaos suite's data port flood (loadgen/bench/chaos/flood.py) against
a plain loopback listener: it keeps its connections open from the given
addresses, and re-opens the ones the listener closes."""
from __future__ import annotations

import socket

from speckv.loadgen.bench.chaos.flood import Flood, loopback_sources
from tests.support.waiting import wait_until


def test_sources_are_distinct_loopback_addresses_other_than_127_0_0_1():
    sources = loopback_sources(300)
    assert len(set(sources)) == 300 and "127.0.0.1" not in sources
    assert all(s.startswith("127.") for s in sources)


def test_the_flood_holds_its_connections_and_reopens_those_the_listener_closes():
    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        listener.settimeout(5.0)
        flood = Flood(listener.getsockname()[:2], connections=4, sources=loopback_sources(2), reopen_s=60.0)
        with flood:
            accepted = [listener.accept() for _ in range(4)]
            assert {peer[0] for _, peer in accepted} == set(loopback_sources(2))
            for conn, _ in accepted[:2]:
                conn.close()  # the "node" ends two: the flood opens two more
            again = [listener.accept() for _ in range(2)]
            assert wait_until(lambda: flood.counts.closed_by_node == 2)
        assert flood.counts.opened == 6 and flood.counts.connect_failed == 0
        for conn, _ in accepted[2:] + again:
            conn.close()
