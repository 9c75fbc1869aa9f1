"""The scheduler with real kvstore servers: KV events build the block index,
Route confirms the cached prefix with the chosen kvstore (one trace across
both), and an order submitted to the scheduler is executed by the source
node's agent and lands on the target."""

import re

import grpc
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console

from speckv.services.cluster.status import cluster_tables
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.kvstore.server import build_server as build_kvstore
from speckv.v1 import common_pb2, kvstore_pb2, kvstore_pb2_grpc, scheduler_pb2
from tests.support.kvstore_service import kvstore as shared_kvstore
from tests.support.scheduler_service import scheduler
from tests.support.waiting import TIMEOUT, wait_until

BLOCK_BYTES = 512  # kvstore "tiny" geometry: 2 layers x 2 (K,V) x 4 tokens x 2 heads x 8 dims x 2 bytes
CHAIN = [1001, 1002, 1003, 1004, 1005]


def kvstore(node_id, scheduler_address, telemetry=None):
    """A kvstore node that registers with the scheduler and heartbeats fast."""
    return shared_kvstore(node_id=node_id, geometry="tiny", scheduler=scheduler_address, heartbeat_interval_s=0.2,
                          telemetry=telemetry)


def nodes(stub):
    state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    return {n.node_id: n for n in state.nodes}


def put_chain(kv, hashes, family="doc"):
    def messages():
        for i, h in enumerate(hashes):
            yield kvstore_pb2.PutBlockRequest(block_hash=h, data=bytes([i + 1]) * BLOCK_BYTES, family=family,
                                              parent_hash=hashes[i - 1] if i else 0, has_parent=i > 0)
    return kv.PutBlocks(messages(), timeout=TIMEOUT)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


def test_events_build_index_and_route_consults_kvstore(spans):
    sched_tel = build_telemetry("scheduler", {}, span_processors=(SimpleSpanProcessor(spans),))
    kv_tel = build_telemetry("kvstore", {}, span_processors=(SimpleSpanProcessor(spans),))
    with scheduler(telemetry=sched_tel) as (server, sched):
        with kvstore("n1", server.address, kv_tel) as (_, kv1), kvstore("n2", server.address, kv_tel):
            assert wait_until(lambda: {k for k, n in nodes(sched).items() if n.alive} == {"n1", "n2"})
            assert put_chain(kv1, CHAIN).stored == len(CHAIN)
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == len(CHAIN))
            assert nodes(sched)["n2"].num_blocks == 0
            state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
            assert state.num_families == 1

            spans.clear()
            reply = sched.Route(scheduler_pb2.RouteRequest(
                request_id="r1", block_hashes=CHAIN + [1006], prompt_tokens=6 * 4 + 3), timeout=TIMEOUT)
            # no family given: the first block hash in decimal
            assert reply.node_id == "n1" and reply.cached_blocks == len(CHAIN) and reply.family == "1001"
            assert reply.fetch_from_node == ""

            # one trace: the scheduler's Route span and the kvstore's Lookup span share it
            finished = spans.get_finished_spans()
            route = [s for s in finished if s.name.endswith("Scheduler/Route") and s.kind.name == "SERVER"]
            lookup = [s for s in finished if s.name.endswith("KVStore/Lookup") and s.kind.name == "SERVER"]
            assert len(route) == 1 and len(lookup) == 1
            assert lookup[0].context.trace_id == route[0].context.trace_id


def test_order_is_replicated_by_the_agent_and_indexed():
    with scheduler() as (server, sched):
        with kvstore("n1", server.address) as (_, kv1), kvstore("n2", server.address) as (_, kv2):
            assert wait_until(lambda: {k for k, n in nodes(sched).items() if n.alive} == {"n1", "n2"})
            put_chain(kv1, CHAIN)
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == len(CHAIN))
            order_id = sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
                family="doc", block_hashes=CHAIN, source_node="n1", target_node="n2", lease_ms=30_000)),
                timeout=TIMEOUT).order_id

            def counts():
                state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
                return {c.state: c.count for c in state.orders}
            assert wait_until(lambda: counts()[common_pb2.ORDER_STATE_COMMITTED] == 1), counts()
            # the target's COMMITTED events reach the index
            assert wait_until(lambda: nodes(sched)["n2"].num_blocks == len(CHAIN))
            assert kv2.Lookup(kvstore_pb2.LookupRequest(block_hashes=CHAIN), timeout=TIMEOUT).prefix_blocks == 5
            with pytest.raises(grpc.RpcError) as err:
                sched.ReportOrderStatus(scheduler_pb2.OrderStatusReport(
                    order_id=order_id, state=common_pb2.ORDER_STATE_FAILED), timeout=TIMEOUT)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_restarted_node_reregisters_and_its_inventory_resets():
    with scheduler() as (server, sched):
        with kvstore("n1", server.address) as (_, kv1):
            put_chain(kv1, CHAIN)
            assert wait_until(lambda: "n1" in nodes(sched) and nodes(sched)["n1"].num_blocks == len(CHAIN))
            first_address = nodes(sched)["n1"].address
        with kvstore("n1", server.address) as (_, kv1):  # a fresh, empty node under the same id
            assert wait_until(lambda: nodes(sched)["n1"].address != first_address)
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 0)
            put_chain(kv1, CHAIN[:2])
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 2)
            reply = sched.Route(scheduler_pb2.RouteRequest(block_hashes=CHAIN, prompt_tokens=5 * 4 + 1),
                                timeout=TIMEOUT)
            assert reply.node_id == "n1" and reply.cached_blocks == 2


def test_event_stream_reconnects_and_resyncs_from_a_snapshot():
    """The kvstore behind a registered address restarts empty: the scheduler's
    stream breaks, reconnects with backoff, and the kvstore (asked for a
    sequence from its future) answers with a SNAPSHOT that replaces the old
    inventory; later events apply on top. Loss detection is off here: with
    it on, the closed stream and the refused reconnect declare n1 down at
    once (tests/services/test_node_loss.py)."""
    with scheduler(loss_probe_s=0) as (_, sched):
        config = KVStoreConfig(node_id="n1", geometry="tiny", device_pages=64)  # no agent: registered by hand
        first = build_kvstore(config, build_telemetry("kvstore", {})).start()
        port = first.port
        channel = grpc.insecure_channel(first.address)
        sched.RegisterNode(scheduler_pb2.RegisterNodeRequest(
            node_id="n1", address=first.address, capacity_pages=64,
            geometry=common_pb2.KVGeometry(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float16",
                                           block_size=4)), timeout=TIMEOUT)
        put_chain(kvstore_pb2_grpc.KVStoreStub(channel), CHAIN)
        assert wait_until(lambda: nodes(sched)["n1"].num_blocks == len(CHAIN))
        channel.close()
        first.stop(grace_s=0.5)

        second = build_kvstore(KVStoreConfig(node_id="n1", geometry="tiny", device_pages=64, port=port),
                               build_telemetry("kvstore", {})).start()
        channel = grpc.insecure_channel(second.address)
        try:
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 0)  # the empty snapshot
            put_chain(kvstore_pb2_grpc.KVStoreStub(channel), [2001, 2002])
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 2)
            sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="n1"), timeout=TIMEOUT)
            reply = sched.Route(scheduler_pb2.RouteRequest(block_hashes=CHAIN, prompt_tokens=21), timeout=TIMEOUT)
            assert reply.cached_blocks == 0
        finally:
            channel.close()
            second.stop(grace_s=0.5)


def test_tiered_nodes_register_their_host_tier_and_orders_land_there_by_default():
    """A node that registers a host tier gets replicas in it (the order's
    default tier): the copy evicts nothing from the target's device tier, and
    a route to a node whose prefix sits in its host tier names the blocks to
    promote."""
    with scheduler(host_link_gbps=8.0, tie_ms=0.1) as (server, sched):
        with shared_kvstore(node_id="n1", geometry="tiny", scheduler=server.address, heartbeat_interval_s=0.2,
                            device_pages=4, host_pages=16) as (_, kv1), \
                shared_kvstore(node_id="n2", geometry="tiny", scheduler=server.address, heartbeat_interval_s=0.2,
                               device_pages=4, host_pages=16) as (_, kv2):
            assert wait_until(lambda: {k for k, n in nodes(sched).items() if n.alive} == {"n1", "n2"})
            put_chain(kv1, CHAIN[:4])
            put_chain(kv1, [2001, 2002], family="other")  # 4 device pages: CHAIN[3], CHAIN[2] go down
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == 6)
            route = sched.Route(scheduler_pb2.RouteRequest(request_id="r", block_hashes=CHAIN[:4],
                                                           prompt_tokens=4 * 4 + 1, family="doc"),
                                timeout=TIMEOUT)
            assert route.node_id == "n1" and route.cached_blocks == 4 and route.promote_blocks == 2, route
            assert route.promote_ms > 0
            sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
                family="doc", block_hashes=CHAIN[:3], source_node="n1", target_node="n2", lease_ms=30_000)),
                timeout=TIMEOUT)
            assert wait_until(lambda: nodes(sched)["n2"].num_blocks == 3)
            stats = kv2.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
            assert (stats.host_replica_pages, stats.used_pages) == (3, 0)
            assert (nodes(sched)["n2"].host_pages, nodes(sched)["n2"].host_blocks) == (16, 3)
            # Each reported its retention cap (the kvstore's default share, 0.5, of its host tier).
            assert nodes(sched)["n2"].retain_max_blocks == 8
            console = Console(width=250, record=True)
            console.print(cluster_tables(sched.GetClusterState(scheduler_pb2.ClusterStateRequest(),
                                                               timeout=TIMEOUT))[0])
            row = next(line for line in console.export_text().splitlines() if "│ n2 " in line)
            assert [cell.strip() for cell in row.split("│")[1:-1]][4:6] == ["3/16", "0/8"]  # host, retained/cap
            # An operator's retain order: the store retains the prefix it holds, says so in its stats, and
            # its heartbeat tells the scheduler (the planner's budget counts it: retention_plan.py).
            sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
                family="doc", block_hashes=CHAIN[:4], source_node="n2", target_node="n2", lease_ms=60_000,
                action="retain")), timeout=TIMEOUT)
            assert wait_until(lambda: nodes(sched)["n2"].retained_blocks == 3)
            stats = kv2.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
            assert (stats.retained_blocks, stats.retain_max_blocks) == (3, 8)
            console = Console(width=250, record=True)
            console.print(cluster_tables(sched.GetClusterState(scheduler_pb2.ClusterStateRequest(),
                                                               timeout=TIMEOUT))[0])
            row = next(line for line in console.export_text().splitlines() if "│ n2 " in line)
            assert [cell.strip() for cell in row.split("│")[1:-1]][5] == "3/8"


@pytest.mark.parametrize("transport, carried", [("tcp", "tcp"), ("grpc", "grpc"), ("auto", "shm")])
def test_a_committed_order_says_which_transport_carried_it(transport, carried):
    """The agent reports the data plane its kvstore used; the scheduler counts
    the copy under (source, target, transport) and `speckv status` shows it.
    auto between two kvstores of one process (one host, one user) is shm."""
    with scheduler() as (server, sched):
        with shared_kvstore(node_id="n1", geometry="tiny", scheduler=server.address, heartbeat_interval_s=0.2,
                            transport=transport) as (_, kv1), \
                kvstore("n2", server.address):
            assert wait_until(lambda: {k for k, n in nodes(sched).items() if n.alive} == {"n1", "n2"})
            put_chain(kv1, CHAIN)
            assert wait_until(lambda: nodes(sched)["n1"].num_blocks == len(CHAIN))
            sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
                family="doc", block_hashes=CHAIN, source_node="n1", target_node="n2", lease_ms=30_000)),
                timeout=TIMEOUT)

            def carriers():
                state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
                return [(t.source_node, t.target_node, t.transport, t.orders, t.bytes) for t in state.transports]
            # the target's KV events may commit the order first: the source's report then labels it
            assert wait_until(lambda: carriers() == [("n1", "n2", carried, 1, len(CHAIN) * BLOCK_BYTES)]), carriers()
            state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
            console = Console(width=200, record=True)
            for table in cluster_tables(state):
                console.print(table)
            shown = console.export_text()
            assert "committed copies by transport" in shown
            assert re.search(rf"│ n1 +│ n2 +│ {carried} +│ 1 +│", shown), shown
