"""The data plane's protection (data_plane_auth, docs/security.md) on real
kvstores and a real scheduler on loopback: writes need the reservation's
capability, replicas go only to registered addresses, bytes are checked
against the source's checksums before publish, and the happy path still
replicates byte for byte."""
from __future__ import annotations

import contextlib
import socket
from typing import Iterator

import grpc
import pytest

from speckv.loadgen.bench.chaos.cases.dataplane import RawWriter
from speckv.services.cluster.certs import make_bundle
from speckv.services.common.clock import ManualClock
from speckv.services.common.rpc.server import open_channel
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.dataplane import wire
from speckv.v1 import common_pb2, kvstore_pb2, kvstore_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tests.support.kvstore_service import block_bytes, get, kvstore, put
from tests.support.scheduler_service import scheduler
from tests.support.waiting import TIMEOUT, wait_until

BLOCK = 512  # tiny geometry
CHAIN = [501, 502, 503]
PERMISSION_DENIED = 7  # on the data plane's wire: the gRPC code number


@contextlib.contextmanager
def cluster(**target_overrides) -> Iterator[tuple]:
    """A plaintext scheduler and two protected kvstores registered with it."""
    with scheduler() as (sched_server, sched):
        common = {"scheduler": sched_server.address, "heartbeat_interval_s": 0.2, "data_plane_auth": "on"}
        with kvstore(node_id="src", **common) as (src_server, src), \
                kvstore(node_id="dst", **{**common, **target_overrides}) as (dst_server, dst):
            def registered() -> set[str]:
                state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
                return {n.node_id for n in state.nodes}
            assert wait_until(lambda: registered() == {"src", "dst"})
            yield src, dst, dst_server


def replicate(src, dst_address: str, hashes: list[int], transport: str = "tcp", target_node: str = "dst"):
    order = common_pb2.ReplicationOrder(order_id="o-1", family="f", block_hashes=hashes, source_node="src",
                                        target_node=target_node, target_address=dst_address)
    return src.Replicate(kvstore_pb2.ReplicateRequest(order=order, transport=transport), timeout=TIMEOUT)


def reserve(dst, hashes: list[int], order_id: str = "o-9") -> kvstore_pb2.ReserveResponse:
    return dst.Reserve(kvstore_pb2.ReserveRequest(order_id=order_id, block_hashes=hashes, source_node="src",
                                                  family="f", lease_ms=30_000), timeout=TIMEOUT)


Writer = RawWriter  # the chaos suite's raw data plane connection (loadgen/bench/chaos/cases/dataplane.py)


def payload(hashes: list[int]) -> bytes:
    return b"".join(block_bytes(h) for h in hashes)


def reserved_pages(stub) -> int:
    return stub.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).reserved_pages


def denied(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code()


@pytest.mark.parametrize("transport", ["tcp", "grpc"])
def test_the_happy_path_replicates_byte_for_byte(transport):
    with cluster() as (src, dst, dst_server):
        put(src, *CHAIN)
        reply = replicate(src, dst_server.address, CHAIN, transport)
        assert reply.state == common_pb2.ORDER_STATE_COMMITTED and reply.blocks_sent == 3
        assert reply.transport == transport
        assert [b.data for b in get(dst, *CHAIN)] == [block_bytes(h) for h in CHAIN]


def test_a_reserve_answers_a_capability_only_when_protected():
    with kvstore() as (_, plain):
        assert reserve(plain, [1]).capability == b""
    with cluster() as (_, dst, _server):
        assert len(reserve(dst, [1]).capability) > 32


def test_data_plane_writes_without_a_valid_capability_are_refused_and_change_nothing():
    with cluster() as (_, dst, _server):
        put(dst, 900)  # data already stored must stay byte-identical
        grant = reserve(dst, CHAIN)
        other = reserve(dst, [601], order_id="o-10")
        forged = bytearray(grant.capability)
        forged[-1] ^= 0x01
        data = payload(CHAIN)
        attempts = {"none": None, "forged": bytes(forged), "another reservation's": other.capability,
                    "garbage": b"\x01" * 80}
        for name, token in attempts.items():
            writer = Writer(grant)
            if token is not None:
                writer.auth(token)
            writer.chunk(0, b"\xee" * len(data))
            reply = writer.reply()
            writer.close()
            assert reply.status == PERMISSION_DENIED, (name, reply)
        # The reservation is intact: the real writer still completes it with its own bytes.
        assert reserved_pages(dst) == 4
        writer = Writer(grant)
        writer.auth(grant.capability, grant.capability_secret)
        writer.chunk(0, data)
        assert writer.end().bytes_received == len(data)
        writer.close()
        commit = kvstore_pb2.CommitRequest(handle=grant.handle, chunk_crc32c={0: crc32c(data)},
                                           capability=grant.capability,
                                           capability_secret=grant.capability_secret)
        assert dst.Commit(commit, timeout=TIMEOUT).blocks_committed == 3
        assert [b.data for b in get(dst, 900, *CHAIN)] == [block_bytes(900), *(block_bytes(h) for h in CHAIN)]


def test_a_chunk_outside_the_capabilitys_range_is_refused_before_the_store():
    with cluster() as (_, dst, _server):
        grant = reserve(dst, [701])
        writer = Writer(grant)
        writer.auth(grant.capability, grant.capability_secret)
        writer.chunk(BLOCK, b"\x00" * 16)  # past the one block reserved
        reply = writer.reply()
        writer.close()
        assert reply.status == PERMISSION_DENIED and "outside" in reply.message
        assert reserved_pages(dst) == 1  # not aborted


def test_an_expired_capability_is_refused():
    clock = ManualClock(1_000.0)
    with scheduler() as (sched_server, _sched), \
            kvstore(clock=clock, node_id="dst", scheduler=sched_server.address, data_plane_auth="on",
                    capability_ttl_s=5.0) as (_, dst):
        grant = reserve(dst, [801])
        clock.advance(6.0)  # past the capability, inside the 30 s reservation lease
        writer = Writer(grant)
        writer.auth(grant.capability, grant.capability_secret)
        reply = writer.reply()
        writer.close()
        assert reply.status == PERMISSION_DENIED and "expired" in reply.message
        assert reserved_pages(dst) == 1


def test_grpc_writes_commits_and_aborts_need_the_capability_and_its_secret():
    with cluster() as (_, dst, _server):
        grant = reserve(dst, [901])
        data = block_bytes(901)
        chunk = kvstore_pb2.WriteChunkRequest(handle=grant.handle, offset=0, data=data, crc32c=crc32c(data))
        assert denied(lambda: dst.WriteChunks(iter([chunk]), timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
        abort = kvstore_pb2.AbortRequest(handle=grant.handle, reason="attacker")
        assert denied(lambda: dst.Abort(abort, timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
        commit = kvstore_pb2.CommitRequest(handle=grant.handle, chunk_crc32c={0: crc32c(data)})
        assert denied(lambda: dst.Commit(commit, timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
        # The capability alone (sniffed off the data plane) proves nothing on gRPC either: it needs its secret.
        chunk.capability, abort.capability, commit.capability = (grant.capability,) * 3
        assert denied(lambda: dst.WriteChunks(iter([chunk]), timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
        assert denied(lambda: dst.Abort(abort, timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
        assert denied(lambda: dst.Commit(commit, timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
        assert reserved_pages(dst) == 1
        chunk.capability_secret = commit.capability_secret = grant.capability_secret
        assert dst.WriteChunks(iter([chunk]), timeout=TIMEOUT).bytes_received == BLOCK
        assert dst.Commit(commit, timeout=TIMEOUT).blocks_committed == 1
        assert get(dst, 901)[0].data == data


def test_a_replicate_toward_an_unregistered_address_connects_nowhere():
    with cluster() as (src, _dst, dst_server), socket.socket() as bait:
        bait.bind(("127.0.0.1", 0))
        bait.listen(8)
        bait.setblocking(False)
        address = f"127.0.0.1:{bait.getsockname()[1]}"
        put(src, *CHAIN)
        for target_node in ("", "dst", "mallory"):
            code = denied(lambda: replicate(src, address, CHAIN, target_node=target_node))
            assert code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(BlockingIOError):
            bait.accept()  # nobody connected
        # the registered address of another node is refused too
        assert denied(lambda: replicate(src, dst_server.address, CHAIN, target_node="src")) \
            == grpc.StatusCode.PERMISSION_DENIED


def test_an_order_to_an_unregistered_address_fails_at_the_source():
    """A plaintext scheduler passes an order's target_address through
    (over TLS SubmitOrder refuses it); the source's agent checks it and
    fails the order without connecting."""
    with scheduler() as (sched_server, sched), socket.socket() as bait:
        common = {"scheduler": sched_server.address, "heartbeat_interval_s": 0.2, "data_plane_auth": "on"}
        with kvstore(node_id="src", **common) as (_, src), kvstore(node_id="dst", **common):
            def state() -> scheduler_pb2.ClusterState:
                return sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
            assert wait_until(lambda: sum(n.alive for n in state().nodes) == 2)
            bait.bind(("127.0.0.1", 0))
            bait.listen(8)
            bait.setblocking(False)
            put(src, *CHAIN)
            sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
                family="f", block_hashes=CHAIN, source_node="src", target_node="dst", lease_ms=30_000,
                target_address=f"127.0.0.1:{bait.getsockname()[1]}")), timeout=TIMEOUT)
            assert wait_until(lambda: {o.state: o.count for o in state().orders}.get(
                common_pb2.ORDER_STATE_FAILED) == 1)
            with pytest.raises(BlockingIOError):
                bait.accept()


def test_bytes_flipped_in_flight_are_detected_and_nothing_is_published():
    """What a data plane proxy flipping one byte after the writer MACed the
    chunk does, whether it leaves the chunk's crc32c as sent or rewrites it
    to match: the chunk fails its MAC (issue 43, item 2; before, a rewritten
    crc32c let the chunk land), the reservation is aborted."""
    with cluster() as (_, dst, _server):
        data = payload(CHAIN)
        flipped = bytearray(data)
        flipped[700] ^= 0x40
        for fix_crc in (False, True):
            grant = reserve(dst, CHAIN, order_id=f"o-flip-{fix_crc}")
            writer = Writer(grant)
            writer.auth(grant.capability, grant.capability_secret)
            writer.chunk(0, bytes(flipped), crc32c(bytes(flipped)) if fix_crc else crc32c(data), mac_over=data)
            reply = writer.reply()
            writer.close()
            assert reply.status == PERMISSION_DENIED and "MAC" in reply.message, reply
            assert wait_until(lambda: reserved_pages(dst) == 0)  # aborted
        assert dst.Lookup(kvstore_pb2.LookupRequest(block_hashes=CHAIN), timeout=TIMEOUT).present == [False] * 3


def test_over_tls_protection_is_on_and_only_the_source_node_may_write(tmp_path):
    """auto = on with TLS: the admin's Replicate copies byte for byte; a
    node's Reserve names itself as the source, and another node's
    certificate may not commit with that capability."""
    with tls_cluster(tmp_path, ["src", "dst"]) as (certs, sched_server, src_server, dst_server):
        with contextlib.ExitStack() as stack:
            def stub(address: str, files) -> kvstore_pb2_grpc.KVStoreStub:
                channel = stack.enter_context(open_channel(address, None, tls=files.load(),
                                                           peer_role="kvstore"))
                return kvstore_pb2_grpc.KVStoreStub(channel)

            src, dst = stub(src_server.address, certs.admin), stub(dst_server.address, certs.admin)
            as_src = stub(dst_server.address, certs.node("src"))
            as_dst = stub(dst_server.address, certs.node("dst"))

            def registered() -> bool:
                try:
                    return replicate_ok(src, dst_server.address)
                except grpc.RpcError:
                    return False
            put(src, *CHAIN)
            assert wait_until(registered)
            assert [b.data for b in get(dst, *CHAIN)] == [block_bytes(h) for h in CHAIN]
            assert denied(lambda: as_dst.Reserve(kvstore_pb2.ReserveRequest(
                order_id="o-x", block_hashes=[1], source_node="src"), timeout=TIMEOUT)) \
                == grpc.StatusCode.PERMISSION_DENIED  # a node reserves only as itself
            grant = as_src.Reserve(kvstore_pb2.ReserveRequest(order_id="o-y", block_hashes=[2], lease_ms=30_000),
                                   timeout=TIMEOUT)
            abort = kvstore_pb2.AbortRequest(handle=grant.handle, capability=grant.capability,
                                             capability_secret=grant.capability_secret)
            assert denied(lambda: as_dst.Abort(abort, timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
            assert as_src.Abort(abort, timeout=TIMEOUT).pages_freed == 1
            channel = stack.enter_context(open_channel(sched_server.address, None, tls=certs.admin.load(),
                                                       peer_role="scheduler"))
            order = common_pb2.ReplicationOrder(family="f", block_hashes=CHAIN, source_node="src",
                                                target_node="dst", lease_ms=30_000, target_address="127.0.0.1:1")
            submit = scheduler_pb2_grpc.SchedulerStub(channel).SubmitOrder
            assert denied(lambda: submit(scheduler_pb2.SubmitOrderRequest(order=order), timeout=TIMEOUT)) \
                == grpc.StatusCode.PERMISSION_DENIED  # over TLS an order goes only where its target registered


@contextlib.contextmanager
def tls_cluster(tmp_path, nodes: list[str]) -> Iterator[tuple]:
    """A TLS scheduler and kvstores named src and dst registered with it (auto
    data_plane_auth: on); yields the cert bundle (for `nodes`), the scheduler,
    src's and dst's servers."""
    from speckv.services.common.rpc.telemetry import build_telemetry
    from speckv.services.scheduler.adapters.config import SchedulerConfig
    from speckv.services.scheduler.adapters.server import build_server as build_scheduler

    certs = make_bundle(tmp_path, nodes)

    def flags(files) -> dict[str, str]:
        return {"tls_cert": files.cert, "tls_key": files.key, "tls_ca": files.ca}

    sched_server = build_scheduler(SchedulerConfig(engine_profile="tiny", tick_s=0.05,
                                                   **flags(certs.service("scheduler"))),
                                   build_telemetry("scheduler", {})).start()
    try:
        common = {"scheduler": sched_server.address, "heartbeat_interval_s": 0.2}
        with kvstore(node_id="src", **common, **flags(certs.node("src"))) as (src_server, _), \
                kvstore(node_id="dst", **common, **flags(certs.node("dst"))) as (dst_server, _):
            yield certs, sched_server, src_server, dst_server
    finally:
        sched_server.stop(grace_s=1.0)


def replicate_ok(src, dst_address: str) -> bool:
    reply = replicate(src, dst_address, CHAIN)
    return reply.state == common_pb2.ORDER_STATE_COMMITTED


def test_a_sniffed_auth_frame_proves_nothing_and_written_bytes_cannot_be_rewritten():
    """Issue 43's reproduction: after the source's chunk and END, a new
    connection replays the sniffed AUTH frame (its proof was over another
    nonce) or sends the token without its secret: PERMISSION_DENIED. Even the
    secret's holder cannot write the range again (ALREADY_EXISTS, TCP and
    WriteChunks alike); the source's Commit publishes its own bytes."""
    with cluster() as (_, dst, _server):
        grant = reserve(dst, CHAIN)
        data = payload(CHAIN)
        writer = Writer(grant)
        writer.auth(grant.capability, grant.capability_secret)
        writer.chunk(0, data)
        assert writer.end().bytes_received == len(data)
        writer.close()
        forged = b"\xee" * len(data)
        for name, auth in {"replayed AUTH": {"proof": writer.last_proof}, "token alone": {},
                           "the secret's holder": {"secret": grant.capability_secret}}.items():
            replay = Writer(grant)
            replay.auth(grant.capability, **auth)
            replay.chunk(0, forged)
            status = replay.reply().status
            replay.close()
            assert status == (6 if name == "the secret's holder" else PERMISSION_DENIED), name  # 6: ALREADY_EXISTS
        chunk = kvstore_pb2.WriteChunkRequest(handle=grant.handle, offset=0, data=forged, crc32c=crc32c(forged),
                                              capability=grant.capability,
                                              capability_secret=grant.capability_secret)
        assert denied(lambda: dst.WriteChunks(iter([chunk]), timeout=TIMEOUT)) == grpc.StatusCode.ALREADY_EXISTS
        assert reserved_pages(dst) == 3  # nothing aborted
        commit = kvstore_pb2.CommitRequest(handle=grant.handle, chunk_crc32c={0: crc32c(data)},
                                           capability=grant.capability,
                                           capability_secret=grant.capability_secret)
        assert dst.Commit(commit, timeout=TIMEOUT).blocks_committed == 3
        assert [b.data for b in get(dst, *CHAIN)] == [block_bytes(h) for h in CHAIN]


def test_over_tls_a_nodes_engine_may_pull_into_it_and_only_to_its_registered_address(tmp_path):
    """A pull (the vLLM connector's kv_transfer_params): the target node's
    engine asks the source to Replicate into the target. Allowed for the
    target's engine, as a pull, to its registered address only; another
    node's engine, the target's kvstore certificate, a replica order (not a
    pull, or with a lease), an address of its choosing, or another source are
    PERMISSION_DENIED."""
    with tls_cluster(tmp_path, ["src", "dst", "other"]) as (certs, _, src_server, dst_server), \
            contextlib.ExitStack() as stack:
        def stub(address: str, files) -> kvstore_pb2_grpc.KVStoreStub:
            channel = stack.enter_context(open_channel(address, None, tls=files.load(), peer_role="kvstore"))
            return kvstore_pb2_grpc.KVStoreStub(channel)

        admin_src, admin_dst = stub(src_server.address, certs.admin), stub(dst_server.address, certs.admin)
        put(admin_src, *CHAIN)
        assert wait_until(lambda: _pull(admin_src, "dst", dst_server.address, CHAIN[:1]) is None)

        dst_engine, other_engine = stub(src_server.address, certs.engine("dst")), \
            stub(src_server.address, certs.engine("other"))
        assert _pull(other_engine, "dst", dst_server.address, CHAIN) == grpc.StatusCode.PERMISSION_DENIED
        dst_node = stub(src_server.address, certs.node("dst"))  # peers never read: a pull is the engine's
        assert _pull(dst_node, "dst", dst_server.address, CHAIN) == grpc.StatusCode.PERMISSION_DENIED
        assert _pull(dst_engine, "dst", dst_server.address, CHAIN, pull=False) == grpc.StatusCode.PERMISSION_DENIED
        assert _pull(dst_engine, "dst", dst_server.address, CHAIN, lease_ms=60_000) \
            == grpc.StatusCode.PERMISSION_DENIED
        assert _pull(dst_engine, "dst", "127.0.0.1:1", CHAIN) == grpc.StatusCode.PERMISSION_DENIED
        assert _pull(dst_engine, "dst", dst_server.address, CHAIN, source="other") \
            == grpc.StatusCode.PERMISSION_DENIED
        assert admin_dst.Lookup(kvstore_pb2.LookupRequest(block_hashes=CHAIN), timeout=TIMEOUT).prefix_blocks == 1
        committed = admin_dst.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).blocks_committed_total
        assert _pull(dst_engine, "dst", dst_server.address, CHAIN) is None
        assert [b.data for b in get(admin_dst, *CHAIN)] == [block_bytes(h) for h in CHAIN]
        # a pull's copy is the node's own (STORED), not a replica landing (COMMITTED)
        assert admin_dst.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).blocks_committed_total == committed


def _pull(source_stub, target: str, address: str, hashes: list[int], source: str = "", pull: bool = True,
          lease_ms: int = 0) -> grpc.StatusCode | None:
    """A pull's Replicate: None when it committed, else the status it raised."""
    order = common_pb2.ReplicationOrder(order_id=f"pull-{target}-{len(hashes)}", family="f", block_hashes=hashes,
                                        source_node=source, target_node=target, target_address=address,
                                        lease_ms=lease_ms)
    try:
        reply = source_stub.Replicate(kvstore_pb2.ReplicateRequest(order=order, pull=pull), timeout=TIMEOUT)
    except grpc.RpcError as error:
        return error.code()
    assert reply.state == common_pb2.ORDER_STATE_COMMITTED, reply
    return None
