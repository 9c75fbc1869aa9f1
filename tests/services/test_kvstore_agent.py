"""Two kvstore nodes with their scheduler agents against the real scheduler."""
from __future__ import annotations

import socket
import threading

import grpc
import pytest

from speckv.services.common.clock import SystemClock
from speckv.services.common.errors import Unavailable
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.kvstore.agent import SchedulerAgent
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.kvstore.disk import records
from speckv.services.kvstore.replication import Replicator
from speckv.services.kvstore.server import build_transports
from speckv.v1 import common_pb2, kvstore_pb2, scheduler_pb2
from tests.support.kvstore_service import TINY, block_bytes, get, kvstore, make_store, put
from tests.support.scheduler_service import scheduler
from tests.support.waiting import TIMEOUT, wait_until


def cluster_state(sched):
    return sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)


def order_counts(sched):
    return {c.state: c.count for c in cluster_state(sched).orders}


def alive(sched):
    return {n.node_id: n for n in cluster_state(sched).nodes if n.alive}


def test_nodes_register_heartbeat_and_execute_orders():
    with scheduler(policy="none") as (sched_server, sched):
        agents = dict(scheduler=sched_server.address, heartbeat_interval_s=0.1, device_pages=32)
        with kvstore(node_id="a", **agents) as (server_a, a), kvstore(node_id="b", **agents) as (server_b, b):
            assert wait_until(lambda: set(alive(sched)) == {"a", "b"})
            nodes = alive(sched)
            assert nodes["a"].address == server_a.address and nodes["a"].capacity_pages == 32
            put(a, 11, 12, 13)
            assert wait_until(lambda: alive(sched)["a"].num_blocks == 3)  # the scheduler follows a's events

            order = common_pb2.ReplicationOrder(block_hashes=[11, 12, 13], source_node="a", target_node="b",
                                                lease_ms=60_000, family="fam")
            sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order), timeout=TIMEOUT)
            assert wait_until(lambda: order_counts(sched).get(common_pb2.ORDER_STATE_COMMITTED) == 1)
            assert [x.data for x in get(b, 11, 12, 13)] == [block_bytes(h) for h in (11, 12, 13)]
            assert b.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).replica_pages == 0  # read: now used

            missing = common_pb2.ReplicationOrder(block_hashes=[99], source_node="a", target_node="b",
                                                  lease_ms=60_000)
            sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=missing), timeout=TIMEOUT)
            assert wait_until(lambda: order_counts(sched).get(common_pb2.ORDER_STATE_FAILED) == 1)


def test_a_redundant_order_copies_like_a_replicate():
    with scheduler(policy="none") as (sched_server, sched):
        agents = dict(scheduler=sched_server.address, heartbeat_interval_s=0.1, device_pages=32)
        with kvstore(node_id="a", **agents) as (_, a), kvstore(node_id="b", **agents) as (_, b):
            assert wait_until(lambda: set(alive(sched)) == {"a", "b"})
            put(a, 11, 12, 13)
            assert wait_until(lambda: alive(sched)["a"].num_blocks == 3)
            order = common_pb2.ReplicationOrder(block_hashes=[11, 12, 13], source_node="a", target_node="b",
                                                lease_ms=60_000, family="fam", action="redundant")
            sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order), timeout=TIMEOUT)
            assert wait_until(lambda: order_counts(sched).get(common_pb2.ORDER_STATE_COMMITTED) == 1)
            assert [x.data for x in get(b, 11, 12, 13)] == [block_bytes(h) for h in (11, 12, 13)]
            one_node = common_pb2.ReplicationOrder(block_hashes=[11], source_node="a", target_node="a",
                                                   lease_ms=1000, action="redundant")
            with pytest.raises(grpc.RpcError) as err:  # a copy needs a peer, as a replicate does
                sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=one_node), timeout=TIMEOUT)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_node_re_registers_with_a_restarted_scheduler_and_stops_cleanly():
    with scheduler(policy="none") as (first_server, first):
        port = first_server.port
        with kvstore(node_id="a", scheduler=first_server.address, heartbeat_interval_s=0.1):
            assert wait_until(lambda: "a" in alive(first))
            first_server.stop(grace_s=0.5)
            with scheduler(policy="none", port=port) as (_, second):
                # The new scheduler answers heartbeats known=false; the node registers again.
                assert wait_until(lambda: "a" in alive(second), timeout=3 * TIMEOUT)
        # kvstore stopped with its agent: no thread left talking to the scheduler.
        assert wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("a-")])


def test_a_prefetch_order_promotes_the_nodes_host_only_blocks_and_moves_nothing_over_the_network():
    with scheduler(policy="none") as (sched_server, sched):
        agents = dict(scheduler=sched_server.address, heartbeat_interval_s=0.1, device_pages=4, host_pages=16)
        with kvstore(node_id="a", **agents) as (_, a):
            assert wait_until(lambda: "a" in alive(sched))
            for chain in ((11, 12), (13, 14), (15, 16)):  # 4 device pages: the oldest chain is demoted
                put(a, *chain)
            stats = a.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
            assert (stats.blocks_demoted_total, stats.blocks_promoted_total) == (2, 0)
            order = common_pb2.ReplicationOrder(block_hashes=[11, 12], source_node="a", target_node="a",
                                                lease_ms=60_000, family="fam", action="prefetch")
            sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order), timeout=TIMEOUT)
            assert wait_until(lambda: order_counts(sched).get(common_pb2.ORDER_STATE_COMMITTED) == 1)
            assert a.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).blocks_promoted_total == 2
            assert [x.data for x in get(a, 11, 12)] == [block_bytes(h) for h in (11, 12)]
            bad = common_pb2.ReplicationOrder(block_hashes=[11], source_node="a", target_node="a", lease_ms=1000,
                                              action="replicate")
            with pytest.raises(grpc.RpcError) as err:
                sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=bad), timeout=TIMEOUT)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            unknown = common_pb2.ReplicationOrder(block_hashes=[11], source_node="a", target_node="a",
                                                  lease_ms=1000, action="evict")
            with pytest.raises(grpc.RpcError) as err:
                sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=unknown), timeout=TIMEOUT)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "evict" in err.value.details()


def test_a_stage_order_reads_the_nodes_disk_only_blocks_into_its_host_tier(tmp_path):
    """Issue 44's staging ahead of a return, on a real kvstore with a disk
    tier: the order's disk-only blocks come up into the host tier, checked;
    nothing reaches the device tier and nothing crosses the network."""
    record = records.record_bytes(TINY.bytes_per_block)
    with scheduler(policy="none") as (sched_server, sched):
        agents = dict(scheduler=sched_server.address, heartbeat_interval_s=0.1, device_pages=2, host_pages=2,
                      disk_dir=str(tmp_path), disk_bytes=8 * record)
        with kvstore(node_id="a", **agents) as (_, a):
            assert wait_until(lambda: "a" in alive(sched))
            for chain in ((11, 12), (13, 14), (15, 16)):  # 2 device, 2 host pages: 11 and 12 go down to the disk
                put(a, *chain)
            assert wait_until(lambda: a.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
                              .disk_counters["written"] == 2)
            order = common_pb2.ReplicationOrder(block_hashes=[11, 12], source_node="a", target_node="a",
                                                lease_ms=60_000, family="fam", action="stage")
            sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order), timeout=TIMEOUT)
            assert wait_until(lambda: order_counts(sched).get(common_pb2.ORDER_STATE_COMMITTED) == 1)
            stats = a.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
            assert stats.disk_counters["read"] == 2 and stats.blocks_promoted_total == 0
            assert stats.blocks_dropped_total == 0  # 13 and 14 went down to the disk to make room
            assert [x.data for x in get(a, 11, 12)] == [block_bytes(h) for h in (11, 12)]
            device = common_pb2.ReplicationOrder(block_hashes=[11], source_node="a", target_node="a",
                                                 lease_ms=1000, action="stage", target_medium="GPU")
            with pytest.raises(grpc.RpcError) as err:
                sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=device), timeout=TIMEOUT)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_a_retain_order_keeps_the_prefix_on_the_node_past_lru_pressure():
    with scheduler(policy="none") as (sched_server, sched):
        agents = dict(scheduler=sched_server.address, heartbeat_interval_s=0.1, device_pages=2, host_pages=4,
                      retain_max_share=0.5)
        with kvstore(node_id="a", **agents) as (_, a):
            assert wait_until(lambda: "a" in alive(sched))
            put(a, 11, 12)
            order = common_pb2.ReplicationOrder(block_hashes=[11, 12, 13], source_node="a", target_node="a",
                                                lease_ms=60_000, family="fam", action="retain")
            sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order), timeout=TIMEOUT)
            assert wait_until(lambda: order_counts(sched).get(common_pb2.ORDER_STATE_COMMITTED) == 1)
            for first in range(20, 40, 2):  # ten chains through 2 device and 4 host pages
                put(a, first, first + 1)
            assert a.Lookup(kvstore_pb2.LookupRequest(block_hashes=[11, 12]), timeout=TIMEOUT).prefix_blocks == 2
            assert [x.data for x in get(a, 11, 12)] == [block_bytes(h) for h in (11, 12)]
            wrong_tier = common_pb2.ReplicationOrder(block_hashes=[11], source_node="a", target_node="a",
                                                     lease_ms=1000, action="retain", target_medium="GPU")
            with pytest.raises(grpc.RpcError) as err:  # a node with a host tier retains there
                sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=wrong_tier), timeout=TIMEOUT)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_a_dns_entry_links_to_every_scheduler_its_name_resolves_to():
    """dns:localhost:PORT: the system resolver's 127.0.0.1, dialled at PORT."""
    with scheduler(policy="none") as (sched_server, sched):
        with kvstore(node_id="a", scheduler=f"dns:localhost:{sched_server.port}", heartbeat_interval_s=0.1):
            assert wait_until(lambda: "a" in alive(sched))


class Zone:
    """A DNS zone the test edits: name -> the addresses it resolves to (whole host:port, so two schedulers on
    127.0.0.1 with their own ports can stand for two pods); a name not in it fails to resolve."""

    def __init__(self):
        self.records: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def set(self, name: str, addresses: list[str]) -> None:
        with self.lock:
            self.records[name] = list(addresses)

    def __call__(self, name: str, port: int) -> list[str]:
        with self.lock:
            if name not in self.records:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return list(self.records[name])


def test_replicas_that_join_dns_get_a_link_and_gone_ones_lose_it():
    zone = Zone()
    store = make_store(num_pages=16, node_id="d")
    transports = build_transports(KVStoreConfig(transport="grpc"), build_telemetry("kvstore", {}), SystemClock())
    replicator = Replicator(store, transports["grpc"], SystemClock())
    timing = dict(policy="none", heartbeat_interval_ms=100, node_timeout_s=1.0)
    with scheduler(**timing) as (first_server, first), scheduler(**timing) as (second_server, second):
        agent = SchedulerAgent(store, replicator, "dns:schedulers:50052", "127.0.0.1:1", None, timeout_s=2.0,
                               discovery_interval_s=0.05, discovery_grace_s=0.3, resolve=zone).start()
        try:
            assert agent.scheduler_links() == ()  # the name resolves to nothing yet: no link, no error
            with pytest.raises(Unavailable, match="no scheduler replica known"):
                agent.registered_nodes()
            zone.set("schedulers", [first_server.address])
            assert wait_until(lambda: "d" in alive(first))
            zone.set("schedulers", [first_server.address, second_server.address])
            assert wait_until(lambda: "d" in alive(second))
            assert agent.registered_nodes() == {"d": "127.0.0.1:1"}
            zone.set("schedulers", [second_server.address])  # the first replica's pod is gone
            assert wait_until(lambda: [link.address for link in agent.scheduler_links()] == [second_server.address])
            assert wait_until(lambda: "d" not in alive(first), timeout=3 * TIMEOUT)  # no heartbeat reaches it now
            assert "d" in alive(second)
        finally:
            agent.stop()
    assert wait_until(lambda: not [t for t in threading.enumerate() if t.name.startswith("d-")])
