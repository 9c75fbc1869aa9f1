"""Chaos area `load`, pre-authentication starvation (issue 43, item 1): a
kvstore's data port flooded with TCP connections that never send a byte,
opened from many loopback addresses and re-opened the moment the node
closes one (chaos/flood.py), while node-0 replicates into that node. Before
issue 43, 64 such sockets filled `data_max_connections` and every
replication failed RESOURCE_EXHAUSTED; now they wait in the doorway's own
bounded table (docs/limits.md) and the replications must commit byte for
byte. The Replicate time flooded against idle is a figure (target: the
issue's >= 0.8x idle throughput), never a verdict."""
from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

from speckv.loadgen.bench.chaos.common import TIMEOUT, intact, order, put
from speckv.loadgen.bench.chaos.flood import Flood, loopback_sources
from speckv.loadgen.bench.chaos.report import Figure, Verdict
from speckv.services.kvstore.dataplane.tcp_target import split_address
from speckv.v1 import common_pb2, kvstore_pb2

if TYPE_CHECKING:
    from speckv.loadgen.bench.chaos.cli import Context

AREA = "load"
SOURCE, TARGET = "node-0", "node-2"
BLOCKS_PER_ORDER = 8
ORDERS = 3  # per phase: idle, then flooded
# A flood connection is re-opened as soon as the node closes it (at data_auth_timeout_s, 1 s, at the
# latest), and by the flood itself after REOPEN_S: the node's closes are what this case sees.
REOPEN_S = 5.0
SETTLE_S = 0.5  # the flood opens its connections before the first order starts
PAUSE_S = 0.5  # between flooded orders: the flood outlives the node's deadline, so re-opened connections meet them
FIRST_HASH = 7_900_000


def run(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    source, target = cluster.kvstore(SOURCE), cluster.kvstore(TARGET)
    registered = cluster.services[TARGET].address
    probe = target.Reserve(kvstore_pb2.ReserveRequest(order_id="o-flood-probe", block_hashes=[FIRST_HASH - 1],
                                                      lease_ms=5_000, source_node=SOURCE), timeout=TIMEOUT)
    target.Abort(kvstore_pb2.AbortRequest(handle=probe.handle, capability=probe.capability,
                                          capability_secret=probe.capability_secret), timeout=TIMEOUT)
    data_address = split_address(probe.data_address)
    chains = [[FIRST_HASH + i * BLOCKS_PER_ORDER + b for b in range(BLOCKS_PER_ORDER)] for i in range(2 * ORDERS)]
    put(source, [h for chain in chains for h in chain])

    def replicate(i: int) -> tuple[float, str]:
        """Seconds of one Replicate, and what went wrong ('' if it committed byte for byte)."""
        start = time.perf_counter()
        # tcp by name: the flood is against the TCP data plane (on one host auto would pick shared memory)
        reply = source.Replicate(kvstore_pb2.ReplicateRequest(
            order=order(SOURCE, TARGET, registered, chains[i], f"o-chaos-flood-{i}"), transport="tcp"),
            timeout=TIMEOUT)
        seconds = time.perf_counter() - start
        held, what = intact(target, chains[i])
        if reply.state != common_pb2.ORDER_STATE_COMMITTED or reply.transport != "tcp" or not held:
            return seconds, f"order {i}: {common_pb2.OrderState.Name(reply.state)} over {reply.transport!r}, {what}"
        return seconds, ""

    idle = [replicate(i) for i in range(ORDERS)]
    sources = loopback_sources(ctx.scale.flood_sources)
    flood = Flood(data_address, ctx.scale.flood_connections, sources, REOPEN_S).start()
    try:
        time.sleep(SETTLE_S)
        flooded = []
        for i in range(ORDERS, 2 * ORDERS):
            flooded.append(replicate(i))
            time.sleep(PAUSE_S)
    finally:
        counts = flood.stop()
    wrong = [what for _, what in idle + flooded if what]

    def verdict() -> Verdict:
        reached = counts.closed_by_node > 0
        return Verdict(not wrong and reached,
                       f"{len(flooded) - sum(bool(w) for _, w in flooded)} of {ORDERS} orders COMMITTED byte for "
                       f"byte under the flood ({counts.opened} connections opened, {counts.closed_by_node} closed "
                       f"by the node, {counts.connect_failed} connects failed)" + (f"; {'; '.join(wrong)}" if wrong
                                                                                     else ""))

    rec.case(AREA, f"{ctx.scale.flood_connections} unauthenticated connections from {len(sources)} addresses, "
                   f"each re-opened as soon as the node closes it, while {SOURCE} replicates into {TARGET}",
             "every replication COMMITTED byte for byte (pre-auth connections hold no data plane slot); "
             "the node closes flood connections (data_auth_timeout_s)", verdict)
    idle_s, flooded_s = statistics.median(s for s, _ in idle), statistics.median(s for s, _ in flooded)
    ratio = idle_s / flooded_s  # throughput flooded / idle: the same bytes per order
    rec.figure(AREA, Figure("Replicate median, idle", idle_s * 1e3, "ms"))
    rec.figure(AREA, Figure("Replicate median, under the pre-auth flood", flooded_s * 1e3, "ms"))
    rec.figure(AREA, Figure("replication throughput flooded / idle", ratio, "x",
                            "issue 43: >= 0.8 (tiny blocks here: latency-bound)", ratio >= 0.8))
