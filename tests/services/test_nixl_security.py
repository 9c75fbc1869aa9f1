"""NIXL on real in-process servers: under data_plane_auth (docs/security.md)
a protected order replicates over nixl, and a NIXL reservation's Commit and
Abort need its write capability (missing, forged or another reservation's:
refused, nothing published), as on every transport; a target restarted at
the same address (a new agent) fails one order cleanly, then takes the next.
What the capability cannot bound (a metadata holder writing the pool
directly) is stated in docs/dataplane.md."""
from __future__ import annotations

import contextlib
from typing import Iterator

import grpc
import pytest

from speckv.services.kvstore.nixl.loader import NixlLoader
from speckv.v1 import common_pb2, kvstore_pb2, scheduler_pb2
from tests.support.kvstore_service import block_bytes, get, kvstore, put
from tests.support.scheduler_service import scheduler
from tests.support.waiting import TIMEOUT, wait_until

pytestmark = pytest.mark.skipif(NixlLoader().api() is None, reason="NIXL is not installed")
CHAIN = [601, 602, 603]


@contextlib.contextmanager
def cluster() -> Iterator[tuple]:
    """A plaintext scheduler and two protected kvstores registered with it,
    the target's pools private (so that auto would not pick shared memory)."""
    with scheduler() as (sched_server, sched):
        common = {"scheduler": sched_server.address, "heartbeat_interval_s": 0.2, "data_plane_auth": "on",
                  "nixl": True}
        with kvstore(node_id="src", **common) as (_, src), \
                kvstore(node_id="dst", shared_memory=False, **common) as (dst_server, dst):
            def registered() -> set[str]:
                state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
                return {n.node_id for n in state.nodes}
            assert wait_until(lambda: registered() == {"src", "dst"})
            yield src, dst, dst_server


def denied(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code()


def test_a_protected_order_replicates_over_nixl():
    with cluster() as (src, dst, dst_server):
        put(src, *CHAIN)
        order = common_pb2.ReplicationOrder(order_id="o-1", family="f", block_hashes=CHAIN, source_node="src",
                                            target_node="dst", target_address=dst_server.address)
        reply = src.Replicate(kvstore_pb2.ReplicateRequest(order=order), timeout=TIMEOUT)  # auto
        assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == "nixl", reply.message
        assert [b.data for b in get(dst, *CHAIN)] == [block_bytes(h) for h in CHAIN]


def test_a_nixl_reservation_commits_and_aborts_only_with_its_capability():
    with cluster() as (_, dst, _server):
        grants = [dst.Reserve(kvstore_pb2.ReserveRequest(order_id=f"o-{h}", block_hashes=[h], source_node="src",
                                                         family="f", lease_ms=30_000, nixl=True), timeout=TIMEOUT)
                  for h in (901, 902)]
        grant, other = grants
        assert grant.capability and len(grant.pages) == 1 and grant.pages_token.startswith("speckv-dst-")
        commit = kvstore_pb2.CommitRequest(handle=grant.handle, chunk_crc32c={0: 0}, shared_memory=True)
        for capability in (b"", b"forged" * 8, other.capability):
            commit.capability = capability
            assert denied(lambda: dst.Commit(commit, timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
            abort = kvstore_pb2.AbortRequest(handle=grant.handle, reason="attacker", capability=capability)
            assert denied(lambda: dst.Abort(abort, timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
        assert dst.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).reserved_pages == 2
        abort = kvstore_pb2.AbortRequest(handle=grant.handle, reason="done", capability=grant.capability,
                                         capability_secret=grant.capability_secret)
        assert dst.Abort(abort, timeout=TIMEOUT).pages_freed == 1
        assert not dst.Lookup(kvstore_pb2.LookupRequest(block_hashes=[901]), timeout=TIMEOUT).present[0]


def test_a_target_restarted_at_the_same_address_fails_one_order_then_takes_the_next():
    """The source holds the old agent's metadata; the new kvstore's Reserve
    names another agent: that order is aborted (nothing reserved stays) and
    fails UNAVAILABLE, and the next one loads the new agent."""
    with kvstore(node_id="src", nixl=True) as (_, src), \
            kvstore(node_id="dst", shared_memory=False, nixl=True) as (first, _):
        port = int(first.address.rpartition(":")[2])
        put(src, *CHAIN)

        def order(order_id: str) -> kvstore_pb2.ReplicateRequest:
            return kvstore_pb2.ReplicateRequest(order=common_pb2.ReplicationOrder(
                order_id=order_id, family="f", block_hashes=CHAIN[:1], source_node="src", target_node="dst",
                target_address=first.address), transport="nixl")
        assert src.Replicate(order("before"), timeout=TIMEOUT).transport == "nixl"
        first.stop(grace_s=1.0)
        with kvstore(node_id="dst", shared_memory=False, port=port, nixl=True) as (_, again):
            assert denied(lambda: src.Replicate(order("stale"), timeout=TIMEOUT)) == grpc.StatusCode.UNAVAILABLE
            assert again.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).reserved_pages == 0
            reply = src.Replicate(order("after"), timeout=TIMEOUT)
            assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.transport == "nixl", reply.message
            assert [b.data for b in get(again, CHAIN[0])] == [block_bytes(CHAIN[0])]
