"""Chaos area `identity`: the issue's attacks by someone who can reach a
port, against the mutual-TLS cluster. Without a certificate the CA signed
nothing is answered; with a node's certificate nothing beyond that node's
rights is done (docs/security.md, "Who may call what")."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from speckv.loadgen.bench.chaos.common import (
    TIMEOUT,
    block_bytes,
    cluster_state,
    intact,
    nodes,
    order,
    order_total,
    put,
)
from speckv.loadgen.bench.chaos.report import Verdict, expect_code
from speckv.services.cluster.certs import make_bundle
from speckv.services.common.rpc.tls import TlsMaterial
from speckv.v1 import common_pb2, kvstore_pb2, kvstore_pb2_grpc, predictor_pb2, scheduler_pb2, scheduler_pb2_grpc

if TYPE_CHECKING:
    from speckv.loadgen.bench.chaos.cli import Context

AREA = "identity"
SEEDED = [7_000_001, 7_000_002, 7_000_003]
POISONED = [7_100_001, 7_100_002]  # hashes node-0 does not hold: a poisoner's write would be the first
DENIED = grpc.StatusCode.PERMISSION_DENIED
INVALID = grpc.StatusCode.INVALID_ARGUMENT
REFUSED = (grpc.StatusCode.UNAVAILABLE,)  # a failed handshake: the call never reaches a handler


def run(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    node0 = cluster.kvstore("node-0")
    put(node0, SEEDED)
    sched = cluster.scheduler()
    policy = sched.GetPolicy(scheduler_pb2.GetPolicyRequest(), timeout=TIMEOUT).name
    registry = {n: s.address for n, s in nodes(sched).items()}

    def unchanged() -> tuple[bool, str]:
        held, what = intact(node0, SEEDED)
        now_policy = sched.GetPolicy(scheduler_pb2.GetPolicyRequest(), timeout=TIMEOUT).name
        now_registry = {n: s.address for n, s in nodes(sched).items()}
        same = held and now_policy == policy and now_registry == registry
        return same, f"{what}; policy {now_policy!r}; registry {'unchanged' if now_registry == registry else 'CHANGED'}"

    plain = {name: grpc.insecure_channel(s.address) for name, s in cluster.services.items()}
    foreign = _foreign_admin(cluster.run_dir / "foreign", cluster.admin)
    foreign_channels = {name: foreign.secure_channel(s.address, (), "kvstore" if s.kind == "kvstore" else s.kind)
                        for name, s in cluster.services.items()}
    try:
        for who, channels in (("no certificate", plain), ("another CA's admin certificate", foreign_channels)):
            kv = kvstore_pb2_grpc.KVStoreStub(channels["node-0"])
            sc = scheduler_pb2_grpc.SchedulerStub(channels["scheduler"])
            evil = [kvstore_pb2.PutBlockRequest(block_hash=h, data=b"\xee" * len(block_bytes(h)), family="evil")
                    for h in SEEDED]
            attempts = {
                "PutBlocks over a seeded hash": lambda: kv.PutBlocks(iter(evil), timeout=TIMEOUT),
                "GetBlocks (read someone's KV)": lambda: list(kv.GetBlocks(
                    kvstore_pb2.GetBlocksRequest(block_hashes=SEEDED), timeout=TIMEOUT)),
                "SetPolicy": lambda: sc.SetPolicy(scheduler_pb2.SetPolicyRequest(name="none"), timeout=TIMEOUT),
                "RegisterNode as node-0": lambda: sc.RegisterNode(scheduler_pb2.RegisterNodeRequest(
                    node_id="node-0", address=ctx.bait_address, capacity_pages=64), timeout=TIMEOUT),
                "Route": lambda: sc.Route(scheduler_pb2.RouteRequest(request_id="x", block_hashes=[1],
                                                                     prompt_tokens=16), timeout=TIMEOUT),
            }
            for what, call in attempts.items():
                rec.case(AREA, f"{who}: {what}", "refused at the handshake (UNAVAILABLE); nothing stored or changed",
                         lambda call=call: expect_code(call, *REFUSED, also=unchanged))
    finally:
        for channel in [*plain.values(), *foreign_channels.values()]:
            channel.close()

    as_node1 = cluster.scheduler("node-1")
    kv_as_node1 = cluster.kvstore("node-0", "node-1")
    rec.case(AREA, "node-1 re-registers node-0 at its own address", "PERMISSION_DENIED; node-0's route unchanged",
             lambda: expect_code(lambda: as_node1.RegisterNode(scheduler_pb2.RegisterNodeRequest(
                 node_id="node-0", address=ctx.bait_address, capacity_pages=64), timeout=TIMEOUT), DENIED,
                 also=unchanged))
    rec.case(AREA, "node-1 heartbeats for node-0 (keep a dead node routable)", "PERMISSION_DENIED",
             lambda: expect_code(lambda: as_node1.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="node-0"),
                                                            timeout=TIMEOUT), DENIED))
    rec.case(AREA, "node-1 calls SetPolicy", "PERMISSION_DENIED; policy unchanged",
             lambda: expect_code(lambda: as_node1.SetPolicy(scheduler_pb2.SetPolicyRequest(name="none"),
                                                            timeout=TIMEOUT), DENIED, also=unchanged))
    rec.case(AREA, "node-1 submits an order", "PERMISSION_DENIED; no order issued",
             lambda: _no_new_order(sched, lambda: as_node1.SubmitOrder(scheduler_pb2.SubmitOrderRequest(
                 order=order("node-0", "node-2", registry["node-2"], SEEDED)), timeout=TIMEOUT)))
    rec.case(AREA, "node-1 reports node-0's order COMMITTED with 10^15 bytes",
             "PERMISSION_DENIED; bytes_replicated stays below 10^15", lambda: _fake_report(cluster, registry))
    rec.case(AREA, "node-1 watches node-0's orders", "PERMISSION_DENIED",
             lambda: expect_code(lambda: as_node1.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id="node-0"),
                                                              timeout=TIMEOUT), DENIED))
    rec.case(AREA, "node-1 calls ReloadModel", "PERMISSION_DENIED; model unchanged",
             lambda: _reload(cluster, "node-1", predictor_pb2.ReloadModelRequest(name="v1"), DENIED))
    rec.case(AREA, "admin ReloadModel of the path / (paths are refused)", "INVALID_ARGUMENT; model unchanged",
             lambda: _reload(cluster, "admin", predictor_pb2.ReloadModelRequest(path="/"), INVALID))
    rec.case(AREA, "admin ReloadModel of the name ../../etc (out of the model root)",
             "INVALID_ARGUMENT; model unchanged",
             lambda: _reload(cluster, "admin", predictor_pb2.ReloadModelRequest(name="../../etc"), INVALID))
    poison = [kvstore_pb2.PutBlockRequest(block_hash=h, data=b"\xee" * len(block_bytes(h)), family="evil")
              for h in POISONED]
    rec.case(AREA, "node-1 PutBlocks into node-0 under hashes node-0 lacks (poison them before the real write)",
             "PERMISSION_DENIED; nothing stored", lambda: expect_code(
                 lambda: kv_as_node1.PutBlocks(iter(poison), timeout=TIMEOUT), DENIED,
                 also=lambda: _absent(node0, POISONED)))
    rec.case(AREA, "node-1 GetBlocks of node-0's blocks (read another node's KV)", "PERMISSION_DENIED",
             lambda: expect_code(lambda: list(kv_as_node1.GetBlocks(
                 kvstore_pb2.GetBlocksRequest(block_hashes=SEEDED), timeout=TIMEOUT)), DENIED))
    rec.case(AREA, "node-1 MapBlocks on node-0 (pin and locate another node's KV)", "PERMISSION_DENIED; nothing pinned",
             lambda: expect_code(lambda: kv_as_node1.MapBlocks(kvstore_pb2.MapBlocksRequest(
                 block_hashes=SEEDED, lease_ms=1000), timeout=TIMEOUT), DENIED,
                 also=lambda: _unpinned(node0)))
    rec.case(AREA, "node-1 calls Replicate on node-0 (make it dial anywhere)", "PERMISSION_DENIED; nothing dialled",
             lambda: expect_code(lambda: kv_as_node1.Replicate(kvstore_pb2.ReplicateRequest(order=order(
                 "node-0", "node-2", ctx.bait_address, SEEDED, "o-evil")), timeout=TIMEOUT), DENIED,
                 also=lambda: (ctx.bait_untouched(), "bait untouched")))
    rec.case(AREA, "admin Replicate toward an unregistered address (a fake kvstore)",
             "PERMISSION_DENIED before any connection", lambda: expect_code(
                 lambda: node0.Replicate(kvstore_pb2.ReplicateRequest(order=order(
                     "node-0", "node-2", ctx.bait_address, SEEDED, "o-fake")), timeout=TIMEOUT), DENIED,
                 also=lambda: (ctx.bait_untouched(), "bait untouched")))
    rec.case(AREA, "admin SubmitOrder toward an unregistered address", "PERMISSION_DENIED; no order issued",
             lambda: _no_new_order(sched, lambda: sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(
                 order=order("node-0", "node-2", ctx.bait_address, SEEDED)), timeout=TIMEOUT)))
    rec.case(AREA, "node-1 reserves on node-2 naming node-0 as the source", "PERMISSION_DENIED; nothing reserved",
             lambda: expect_code(lambda: cluster.kvstore("node-2", "node-1").Reserve(kvstore_pb2.ReserveRequest(
                 order_id="o-spoof", block_hashes=[5], source_node="node-0", lease_ms=5_000), timeout=TIMEOUT),
                 DENIED))


def _foreign_admin(directory: Path, real: TlsMaterial) -> TlsMaterial:
    """An admin certificate of another CA, presented to servers that trust only the cluster's."""
    foreign = make_bundle(directory, ["node-0"]).admin.load()
    return TlsMaterial(foreign.cert_pem, foreign.key_pem, real.ca_pem, foreign.identity)


def _no_new_order(sched, call) -> Verdict:
    before = order_total(sched)
    verdict = expect_code(call, DENIED)
    after = order_total(sched)
    return Verdict(verdict.ok and after == before, f"{verdict.observed}; orders {before} -> {after}")


def _fake_report(cluster, registry: dict[str, str]) -> Verdict:
    sched = cluster.scheduler()
    order_id = sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=order(
        "node-0", "node-2", registry["node-2"], [7_100_001])), timeout=TIMEOUT).order_id
    report = scheduler_pb2.OrderStatusReport(order_id=order_id, state=common_pb2.ORDER_STATE_COMMITTED,
                                             bytes_sent=10 ** 15, blocks_sent=1)
    verdict = expect_code(lambda: cluster.scheduler("node-1").ReportOrderStatus(report, timeout=TIMEOUT), DENIED)
    replicated = cluster_state(sched).bytes_replicated
    return Verdict(verdict.ok and replicated < 10 ** 15, f"{verdict.observed}; bytes_replicated {replicated}")


def _reload(cluster, who: str, request: predictor_pb2.ReloadModelRequest, wanted: grpc.StatusCode) -> Verdict:
    before = cluster.predictor().GetModelInfo(predictor_pb2.ModelInfoRequest(), timeout=TIMEOUT)
    verdict = expect_code(lambda: cluster.predictor(who).ReloadModel(request, timeout=TIMEOUT), wanted)
    after = cluster.predictor().GetModelInfo(predictor_pb2.ModelInfoRequest(), timeout=TIMEOUT)
    same = (before.version, before.source) == (after.version, after.source)
    return Verdict(verdict.ok and same, f"{verdict.observed}; model {after.version} from {after.source}")


def _absent(kv: kvstore_pb2_grpc.KVStoreStub, hashes: list[int]) -> tuple[bool, str]:
    present = list(kv.Lookup(kvstore_pb2.LookupRequest(block_hashes=hashes), timeout=TIMEOUT).present)
    return not any(present), f"present {present}"


def _unpinned(kv: kvstore_pb2_grpc.KVStoreStub) -> tuple[bool, str]:
    pinned = kv.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT).pinned_pages
    return pinned == 0, f"{pinned} pages pinned"
