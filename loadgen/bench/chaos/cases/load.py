"""Chaos area `load`: idle data plane connections and idle streams held
open while unary calls go on. Behaviour is judged (caps hold, refusals are
immediate, unary calls answer, nodes stay alive); latency and memory are
figures against the issue's targets (unary p99 <= 2x idle, growth < 200
MiB; TLS Route p99 <= 1.3x plaintext), reported, not judged."""
from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Callable

import grpc

from speckv.loadgen.bench.chaos.cases import preauth
from speckv.loadgen.bench.chaos.cases.dataplane import skip_challenge
from speckv.loadgen.bench.chaos.common import TIMEOUT, nodes, percentile, put, wait_until
from speckv.loadgen.bench.chaos.report import Figure, Verdict
from speckv.services.kvstore.dataplane import wire
from speckv.services.kvstore.dataplane.tcp_target import split_address
from speckv.v1 import kvstore_pb2, scheduler_pb2

if TYPE_CHECKING:
    from speckv.loadgen.bench.chaos.cli import Context

AREA = "load"
MIB = 1 << 20
HASHES = [7_800_001, 7_800_002, 7_800_003, 7_800_004]
UNAUTH_PER_ADDRESS = 16  # the kvstore's default data_unauth_per_address (docs/limits.md)
WIRE_RESOURCE_EXHAUSTED = 8
STREAMS_PER_PEER_CAP = 64  # every service's default max_streams_per_peer: the suite is one peer host


def _latencies(ctx: "Context") -> tuple[list[float], list[float]]:
    """Route and Lookup latencies (ms), alternating call by call."""
    sched, node0 = ctx.cluster.scheduler(), ctx.cluster.kvstore("node-0")
    route = scheduler_pb2.RouteRequest(request_id="lat", block_hashes=HASHES, prompt_tokens=64, family="lat")
    lookup = kvstore_pb2.LookupRequest(block_hashes=HASHES)
    routes, lookups = [], []
    for _ in range(ctx.scale.latency_calls):
        start = time.perf_counter()
        sched.Route(route, timeout=TIMEOUT)
        routes.append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        node0.Lookup(lookup, timeout=TIMEOUT)
        lookups.append((time.perf_counter() - start) * 1e3)
    return routes, lookups


def _rss(ctx: "Context") -> int:
    return sum(ctx.cluster.rss_bytes(n) for n in ("scheduler", "node-0"))


def run(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    node0, sched = cluster.kvstore("node-0"), cluster.scheduler()
    put(node0, HASHES)
    _latencies(ctx)  # warm-up: channels, caches
    idle_routes, idle_lookups = _latencies(ctx)
    rss_before = _rss(ctx)

    after = node0.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).last_event_sequence
    streams_kv = [node0.SubscribeEvents(kvstore_pb2.SubscribeEventsRequest(after_sequence=after), timeout=120)
                  for _ in range(ctx.scale.idle_streams // 2)]
    streams_sched = [sched.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id=""), timeout=120)
                     for _ in range(ctx.scale.idle_streams - len(streams_kv))]
    for call in [*streams_kv, *streams_sched]:
        call.initial_metadata()  # admitted (headers) or refused (ended): settled either way
    refused_streams = [c.code() for c in [*streams_kv, *streams_sched] if c.done()]
    stream_routes, stream_lookups = _latencies(ctx)

    # Idle connections last: they send no opening frame, so at most
    # data_unauth_per_address of them wait (all come from this one address),
    # the rest are refused, and the node closes every one after
    # data_auth_timeout_s (1 s): they are measured at once. Where the data plane listens: a reservation's data address.
    grant = node0.Reserve(kvstore_pb2.ReserveRequest(order_id="o-probe", block_hashes=[7_800_100], lease_ms=5_000,
                                                     source_node="node-1"), timeout=TIMEOUT)
    node0.Abort(kvstore_pb2.AbortRequest(handle=grant.handle, capability=grant.capability,
                                         capability_secret=grant.capability_secret), timeout=TIMEOUT)
    data_address = split_address(grant.data_address)
    held: list[socket.socket] = []
    for _ in range(ctx.scale.idle_connections):
        sock = socket.create_connection(data_address, timeout=TIMEOUT)
        sock.setblocking(False)
        held.append(sock)
    loaded_routes, loaded_lookups = _latencies(ctx)
    rss_during = _rss(ctx)
    endings = [_ending(sock) for sock in held]  # each one's reply text ('' for a bare close; None: still open)
    alive = {n: s.alive for n, s in nodes(sched).items()}
    for call in [*streams_kv, *streams_sched]:
        call.cancel()
    for sock in held:
        sock.close()

    refused_at_once = sum("data_unauth_per_address" in (e or "") for e in endings)
    timed_out = sum("data_auth_timeout_s" in (e or "") for e in endings)
    expected_refused = max(0, ctx.scale.idle_connections - UNAUTH_PER_ADDRESS)
    rec.case(AREA, f"{ctx.scale.idle_connections} idle data plane connections (no opening frame, one address)",
             f"at most data_unauth_per_address ({UNAUTH_PER_ADDRESS}) wait, the rest refused (held unread, "
             "answered at data_auth_timeout_s); every one closed by the node within it",
             lambda: Verdict(refused_at_once >= expected_refused and None not in endings,
                             f"{refused_at_once} refused per address (>= {expected_refused} expected), {timed_out} "
                             f"closed at the auth deadline, {endings.count(None)} left open"))
    expected_streams = sum(max(0, len(s) - STREAMS_PER_PEER_CAP) for s in (streams_kv, streams_sched))
    rec.case(AREA, f"{ctx.scale.idle_streams} idle streams (SubscribeEvents + WatchOrders, one peer host)",
             "admitted up to the per-peer cap, every other one RESOURCE_EXHAUSTED at once",
             lambda: Verdict(len(refused_streams) >= expected_streams and all(
                 c == grpc.StatusCode.RESOURCE_EXHAUSTED for c in refused_streams),
                 f"{len(refused_streams)} refused (>= {expected_streams} expected), codes "
                 f"{sorted({c.name for c in refused_streams})}"))
    rec.case(AREA, "unary calls while connections and streams are held",
             f"every Route and Lookup answered ({ctx.scale.latency_calls} each); every node still alive",
             lambda: Verdict(len(loaded_routes) == ctx.scale.latency_calls and all(alive.values()),
                             f"{len(loaded_routes)} Routes, {len(loaded_lookups)} Lookups answered; alive {alive}"))

    replies: list[int] = []

    def served() -> bool:
        """A frame gets the handler's answer, not the acceptor's refusal
        (with protection on, an END for no reservation is refused too, but by
        a connection's own handler)."""
        sock = socket.create_connection(data_address, timeout=TIMEOUT)
        sock.settimeout(TIMEOUT)
        try:
            sock.sendall(wire.encode_header(wire.header_buffer(), wire.Kind.END, b"none", 0, 0, 0))
            skip_challenge(sock)
            replies.append(wire.read_reply(sock).status)
            return replies[-1] != WIRE_RESOURCE_EXHAUSTED
        except OSError:
            return False
        finally:
            sock.close()

    def stream_admitted(open_stream: Callable[[], grpc.Call]) -> bool:
        call = open_stream()
        call.initial_metadata()
        admitted = not call.done()
        call.cancel()
        return admitted

    def slots_back() -> Verdict:
        # A handler notices its client went away at its next poll (the event
        # log's poll_s, the order queue's): slots come back within a bounded wait.
        start = time.monotonic()
        data_ok = wait_until(served, 15.0)
        kv_ok = wait_until(lambda: stream_admitted(lambda: node0.SubscribeEvents(
            kvstore_pb2.SubscribeEventsRequest(after_sequence=after), timeout=2)), 15.0)
        sched_ok = wait_until(lambda: stream_admitted(lambda: sched.WatchOrders(
            scheduler_pb2.WatchOrdersRequest(node_id=""), timeout=2)), 15.0)
        return Verdict(data_ok and kv_ok and sched_ok,
                       f"new data connection served: {data_ok} (wire status {replies[-1:]}); new SubscribeEvents "
                       f"admitted: {kv_ok}; new WatchOrders admitted: {sched_ok}; all within "
                       f"{time.monotonic() - start:.1f} s")

    rec.case(AREA, "after the idle clients go", "a new data connection and a new stream are served", slots_back)

    for name, idle, streams, loaded in (("Route", idle_routes, stream_routes, loaded_routes),
                                        ("Lookup", idle_lookups, stream_lookups, loaded_lookups)):
        ratio = percentile(loaded, 99) / percentile(idle, 99)
        rec.figure(AREA, Figure(f"{name} p99 idle", percentile(idle, 99), "ms"))
        rec.figure(AREA, Figure(f"{name} p99 with idle streams held", percentile(streams, 99), "ms"))
        rec.figure(AREA, Figure(f"{name} p99 with idle streams and connections held", percentile(loaded, 99), "ms"))
        rec.figure(AREA, Figure(f"{name} p99 ratio held/idle", ratio, "x", "target <= 2", ratio <= 2.0))
    growth = (rss_during - rss_before) / MIB
    rec.figure(AREA, Figure("RSS growth of scheduler + node-0 while held", growth, "MiB", "target < 200",
                            growth < 200))
    preauth.run(ctx)
    _tls_cost(ctx)


def _ending(sock: socket.socket, wait_s: float = 5.0) -> str | None:
    """The reply the node sent before closing sock ('' for a bare close), or
    None if the node still holds it open after wait_s."""
    sock.setblocking(True)
    sock.settimeout(wait_s)
    try:
        skip_challenge(sock)  # an admitted connection of a protected node is challenged first
        reply = wire.read_reply(sock)
        sock.recv(1)  # the close after it
        return reply.message
    except wire.ConnectionLost:
        return ""
    except (TimeoutError, socket.timeout):
        return None
    except OSError:
        return ""


def _tls_cost(ctx: "Context") -> None:
    """TLS against plaintext Route p99: `speckv bench scheduler --tls`'s own
    measurement (two scheduler processes called in turn). Full runs only: it
    starts two more processes and its figure is not a case."""
    if not ctx.scale.tls_calls:
        return
    from speckv.loadgen.bench.scheduler.cli import tls_versus_plaintext
    result = tls_versus_plaintext(ctx.scale.tls_calls)
    plain, tls = result["route_ms"]["plaintext"]["p99"], result["route_ms"]["tls"]["p99"]
    ctx.recorder.figure(AREA, Figure("Route p99 plaintext (bench scheduler --tls)", plain, "ms"))
    ctx.recorder.figure(AREA, Figure("Route p99 TLS", tls, "ms"))
    ctx.recorder.figure(AREA, Figure("Route p99 TLS / plaintext", tls / plain, "x", "target <= 1.3",
                                     tls / plain <= 1.3))
