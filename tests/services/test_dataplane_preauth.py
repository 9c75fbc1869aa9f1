"""Pre-authentication starvation of the TCP data plane (issue 43, item 1),
on real kvstores on loopback: connections that never send their opening
frame hold no slot of data_max_connections, are refused past their own caps
(data_unauth_max_connections, data_unauth_per_address) and closed after
data_auth_timeout_s, and a replication completes byte for byte while such
connections are opened and re-opened from many addresses."""
from __future__ import annotations

import socket

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from speckv.loadgen.bench.chaos.flood import Flood, loopback_sources
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.kvstore.dataplane import wire
from speckv.services.kvstore.dataplane.tcp_target import split_address
from speckv.v1 import common_pb2, kvstore_pb2
from tests.services.test_dataplane_security import cluster, replicate
from tests.support.kvstore_service import block_bytes, get, kvstore, put
from tests.support.waiting import TIMEOUT, wait_until

RESOURCE_EXHAUSTED, UNAVAILABLE = 8, 14  # on the data plane's wire: the gRPC code numbers
SHORT = {"data_auth_timeout_s": 0.3, "data_read_timeout_s": 60.0}  # a short deadline; served ones never time out


def data_address(stub, source_node: str = "") -> tuple[str, int]:
    grant = stub.Reserve(kvstore_pb2.ReserveRequest(order_id="probe", block_hashes=[999], lease_ms=5_000,
                                                    source_node=source_node), timeout=TIMEOUT)
    stub.Abort(kvstore_pb2.AbortRequest(handle=grant.handle, capability=grant.capability,
                                        capability_secret=grant.capability_secret), timeout=TIMEOUT)
    return split_address(grant.data_address)


def idle(address: tuple[str, int], source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(address, timeout=TIMEOUT, source_address=(source, 0))
    sock.settimeout(TIMEOUT)
    return sock


def ending(sock: socket.socket) -> wire.Reply | None:
    """What the node sent before closing sock: its reply (None: a bare
    close); fails the test if the node keeps it open past TIMEOUT."""
    try:
        reply = wire.read_reply(sock)
    except (wire.ConnectionLost, ConnectionResetError):
        return None
    assert sock.recv(1) == b""  # and then the close
    return reply


def served(address: tuple[str, int]) -> int:
    """A rightful connection's END answer (no AUTH asked here: plaintext)."""
    sock = idle(address)
    try:
        sock.sendall(bytes(wire.encode_header(wire.header_buffer(), wire.Kind.END, b"none", 0, 0, 0)))
        return wire.read_reply(sock).status
    finally:
        sock.close()


def gauge(reader: InMemoryMetricReader, name: str, key: str) -> dict[str, float]:
    """The gauge's points by the attribute key."""
    data = reader.get_metrics_data()
    return {p.attributes[key]: p.value for rm in (data.resource_metrics if data else ())
            for scope in rm.scope_metrics for m in scope.metrics if m.name == name for p in m.data.data_points}


def refusals(reader: InMemoryMetricReader) -> dict[str, float]:
    """speckv.kvstore.dataplane.refused by cause."""
    return gauge(reader, "speckv.kvstore.dataplane.refused", "cause")


def held(reader: InMemoryMetricReader) -> float:
    return gauge(reader, "speckv.kvstore.dataplane.connections", "state")["held"]


def test_an_idle_connection_is_closed_after_the_auth_deadline_and_holds_no_slot():
    reader = InMemoryMetricReader()
    telemetry = build_telemetry("kvstore", {}, metric_readers=(reader,))
    with kvstore(telemetry=telemetry, data_max_connections=1, **SHORT) as (_server, stub):
        address = data_address(stub)
        silent, partial = idle(address), idle(address)
        partial.sendall(bytes(wire.encode_header(wire.header_buffer(), wire.Kind.END, b"none", 0, 0, 0))[:10])
        assert served(address) == wire.OK  # the one slot is not theirs
        for sock in (silent, partial):
            reply = ending(sock)
            assert reply is not None and reply.status == UNAVAILABLE and "data_auth_timeout_s" in reply.message
            sock.close()
        assert refusals(reader)["timed_out"] == 2 and refusals(reader)["refused_slots"] == 0


def test_unauthenticated_connections_past_their_caps_are_refused_and_a_rightful_one_is_served():
    caps = {"data_max_connections": 2, "data_unauth_max_connections": 6, "data_unauth_per_address": 3, **SHORT}
    with kvstore(**caps) as (_server, stub):
        address = data_address(stub)
        sources = loopback_sources(4)
        flood = [idle(address, sources[i // 6]) for i in range(24)]  # 6 from each of 4 addresses, in turn
        assert served(address) == wire.OK and served(address) == wire.OK
        replies = [ending(sock) for sock in flood]  # every one is closed by the node
        for sock in flood:
            sock.close()
        statuses = {r.status for r in replies if r is not None}
        assert statuses <= {RESOURCE_EXHAUSTED, UNAVAILABLE}
        messages = " ".join(r.message for r in replies if r is not None)
        assert "data_unauth_per_address" in messages and "data_auth_timeout_s" in messages
        assert served(address) == wire.OK


def test_a_replication_completes_byte_for_byte_while_the_data_port_is_flooded():
    hashes = list(range(1_001, 1_025))  # 24 blocks
    # 16 flooding addresses x 4 each > 32 rows: the table is full and displaces; the busiest address then
    # holds >= 2 rows, more than the rightful source's one.
    caps = {"data_unauth_max_connections": 32, "data_unauth_per_address": 4, "data_auth_timeout_s": 0.5}
    with cluster(**caps) as (src, dst, dst_server):
        put(src, *hashes)
        address = data_address(dst, source_node="src")
        with Flood(address, connections=200, sources=loopback_sources(16), reopen_s=0.2) as flood:
            for i in range(4):  # orders one after another, each opening its own data connection
                chain = hashes[i * 6:(i + 1) * 6]
                reply = replicate(src, dst_server.address, chain)
                assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == "tcp", reply
                assert [b.data for b in get(dst, *chain)] == [block_bytes(h) for h in chain]
        assert flood.counts.opened > 200 and flood.counts.closed_by_node > 0  # the flood reached the node


def test_a_refused_connection_is_held_unanswered_until_its_deadline_or_until_the_hold_is_full():
    """So a flooder that reconnects as soon as it is refused cannot make
    the node refuse as fast as it can accept: it is answered at its
    deadline, or early when 4 x data_unauth_max_connections newer refused
    ones are held (the oldest first)."""
    reader = InMemoryMetricReader()
    telemetry = build_telemetry("kvstore", {}, metric_readers=(reader,))
    caps = {"data_unauth_max_connections": 1, "data_unauth_per_address": 1, "data_auth_timeout_s": 30.0}
    with kvstore(telemetry=telemetry, **caps) as (_server, stub):
        address = data_address(stub)
        source = loopback_sources(1)[0]
        waiting = idle(address, source)
        refused = [idle(address, source) for _ in range(4)]  # the hold's size: 4 x 1 row
        assert wait_until(lambda: held(reader) == 4)
        refused[0].settimeout(0.2)
        with pytest.raises(TimeoutError):
            refused[0].recv(1)  # not answered at once: held
        refused[0].settimeout(TIMEOUT)
        refused.append(idle(address, source))  # one more: the oldest held is answered now, not in 30 s
        reply = ending(refused[0])
        assert reply is not None and "data_unauth_per_address" in reply.message
        assert wait_until(lambda: held(reader) == 4) and refusals(reader)["refused_per_address"] == 5
        for sock in [waiting, *refused]:
            sock.close()
