"""Mutual TLS and identities against real servers on loopback: a scheduler,
kvstores and a predictor with certificates from one bundle, called through
real channels presenting each identity's certificate."""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from speckv.services import cli
from speckv.services.cluster.certs import CertBundle, make_bundle
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.rpc.server import ServerSettings, ServiceServer, open_channel
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.common.rpc.tls import TlsFiles, dial
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.kvstore.server import build_server as build_kvstore
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server as build_predictor
from speckv.services.predictor.serving.manifest import write_manifest
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.server import build_server as build_scheduler
from speckv.v1 import (
    common_pb2,
    kvstore_pb2,
    kvstore_pb2_grpc,
    predictor_pb2,
    predictor_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from tests.support.kvstore_service import put
from tests.support.scheduler_service import register
from tests.support.waiting import TIMEOUT, wait_until

NODES = ["node-a", "node-b"]


def _flags(files: TlsFiles) -> dict[str, str]:
    return {"tls_cert": files.cert, "tls_key": files.key, "tls_ca": files.ca}


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> CertBundle:
    return make_bundle(tmp_path_factory.mktemp("tls"), NODES)


@contextlib.contextmanager
def tls_scheduler(certs: CertBundle) -> Iterator[ServiceServer]:
    config = SchedulerConfig(engine_profile="tiny", tick_s=0.05, **_flags(certs.service("scheduler")))
    config.validate()
    server = build_scheduler(config, build_telemetry("scheduler", {})).start()
    try:
        yield server
    finally:
        server.stop(grace_s=1.0)


@pytest.fixture(scope="module")
def scheduler(certs) -> Iterator[ServiceServer]:
    with tls_scheduler(certs) as server:
        yield server


@contextlib.contextmanager
def stub_as(address: str, files: TlsFiles | None,
            role: str = "scheduler") -> Iterator[scheduler_pb2_grpc.SchedulerStub]:
    channel = open_channel(address, None, tls=files.load() if files else None, peer_role=role)
    try:
        yield scheduler_pb2_grpc.SchedulerStub(channel)
    finally:
        channel.close()


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code()


def test_a_client_without_a_certificate_cannot_call(scheduler, certs):
    request = health_pb2.HealthCheckRequest()
    with grpc.insecure_channel(scheduler.address) as plain:
        assert code_of(lambda: health_pb2_grpc.HealthStub(plain).Check(request, timeout=TIMEOUT)) \
            == grpc.StatusCode.UNAVAILABLE
    ca_only = grpc.ssl_channel_credentials(root_certificates=certs.service("scheduler").load().ca_pem)
    with grpc.secure_channel(scheduler.address, ca_only,
                             options=[("grpc.ssl_target_name_override", "scheduler.speckv")]) as anonymous:
        assert code_of(lambda: health_pb2_grpc.HealthStub(anonymous).Check(request, timeout=TIMEOUT)) \
            == grpc.StatusCode.UNAVAILABLE
    stranger = make_bundle(certs.root.parent / "stranger", ["node-a"]).node("node-a")  # same name, another CA
    with stub_as(scheduler.address, stranger) as stub:
        assert code_of(lambda: register(stub, "node-a", "127.0.0.1:1")) == grpc.StatusCode.UNAVAILABLE
    with dial(scheduler.address, certs.admin.load()) as channel:  # by address: loopback is in every server cert
        assert health_pb2_grpc.HealthStub(channel).Check(request, timeout=TIMEOUT).status \
            == health_pb2.HealthCheckResponse.SERVING


def test_a_client_that_expects_another_role_refuses_the_server(scheduler, certs):
    with stub_as(scheduler.address, certs.admin, role="predictor") as stub:
        assert code_of(lambda: stub.GetPolicy(scheduler_pb2.GetPolicyRequest(), timeout=TIMEOUT)) \
            == grpc.StatusCode.UNAVAILABLE


def test_a_node_registers_and_heartbeats_only_as_itself(scheduler, certs):
    with stub_as(scheduler.address, certs.node("node-a")) as stub:
        assert code_of(lambda: register(stub, "node-b", "127.0.0.1:1")) == grpc.StatusCode.PERMISSION_DENIED
        assert register(stub, "node-a", "127.0.0.1:1").node_id == "node-a"
        assert stub.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="node-a"), timeout=TIMEOUT).known
        assert code_of(lambda: stub.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="node-b"), timeout=TIMEOUT)) \
            == grpc.StatusCode.PERMISSION_DENIED
    with stub_as(scheduler.address, certs.admin) as admin:
        assert code_of(lambda: register(admin, "node-b", "127.0.0.1:1")) == grpc.StatusCode.PERMISSION_DENIED
        nodes = admin.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT).nodes
        assert [n.node_id for n in nodes if n.node_id in NODES] == ["node-a"]


def test_set_policy_needs_the_admin(scheduler, certs):
    request = scheduler_pb2.SetPolicyRequest(name="none")
    for who in (certs.node("node-a"), certs.service("scheduler"), certs.service("predictor")):
        with stub_as(scheduler.address, who) as stub:
            with pytest.raises(grpc.RpcError) as denied:
                stub.SetPolicy(request, timeout=TIMEOUT)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "needs the admin identity spiffe://speckv/admin" in denied.value.details()
    with stub_as(scheduler.address, certs.admin) as admin:
        assert admin.SetPolicy(request, timeout=TIMEOUT).name == "none"


def test_orders_are_submitted_by_the_admin_and_reported_by_their_source(scheduler, certs):
    for node in NODES:
        with stub_as(scheduler.address, certs.node(node)) as stub:
            register(stub, node, "127.0.0.1:1")
    order = scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
        family="f", block_hashes=[1, 2], source_node="node-a", target_node="node-b", lease_ms=60_000))
    with stub_as(scheduler.address, certs.node("node-a")) as stub:
        assert code_of(lambda: stub.SubmitOrder(order, timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
        assert code_of(lambda: stub.WatchOrders(scheduler_pb2.WatchOrdersRequest(node_id=""), timeout=TIMEOUT)
                       .next()) == grpc.StatusCode.PERMISSION_DENIED
    with stub_as(scheduler.address, certs.admin) as admin:
        first = admin.SubmitOrder(order, timeout=TIMEOUT).order_id
        second = admin.SubmitOrder(order, timeout=TIMEOUT).order_id

    def report(order_id: str, state: int) -> scheduler_pb2.OrderStatusAck:
        return stub.ReportOrderStatus(scheduler_pb2.OrderStatusReport(order_id=order_id, state=state),
                                      timeout=TIMEOUT)

    with stub_as(scheduler.address, certs.node("node-b")) as stub:  # the target, not the source
        assert code_of(lambda: report(first, common_pb2.ORDER_STATE_COMMITTED)) == grpc.StatusCode.PERMISSION_DENIED
    with stub_as(scheduler.address, certs.node("node-a")) as stub:
        assert report(first, common_pb2.ORDER_STATE_IN_FLIGHT).state == common_pb2.ORDER_STATE_IN_FLIGHT
    with stub_as(scheduler.address, certs.admin) as stub:
        assert report(second, common_pb2.ORDER_STATE_CANCELLED).state == common_pb2.ORDER_STATE_CANCELLED


def test_a_tls_kvstore_registers_streams_its_events_and_is_routed_to(certs):
    """The node's own calls (RegisterNode, Heartbeat, WatchOrders) and the
    scheduler's to it (SubscribeEvents, the confirming Lookup) all run over
    mutual TLS; Replicate is the admin's. A scheduler of its own: the
    module's has nodes of another geometry."""
    files = certs.node("node-b")
    with contextlib.ExitStack() as stack:
        scheduler = stack.enter_context(tls_scheduler(certs))
        config = KVStoreConfig(node_id="node-b", device_pages=64, scheduler=scheduler.address,
                               heartbeat_interval_s=0.2, **_flags(files))
        config.validate()
        node = build_kvstore(config, build_telemetry("kvstore", {})).start()
        stack.callback(node.stop, grace_s=1.0)
        with open_channel(node.address, None, tls=files.load(), peer_role="kvstore") as channel, \
                open_channel(node.address, None, tls=certs.engine("node-b").load(), peer_role="kvstore") as engine:
            kv = kvstore_pb2_grpc.KVStoreStub(channel)
            # its blocks come from its engine (a node's own certificate may not PutBlocks: test_block_privilege.py)
            assert put(kvstore_pb2_grpc.KVStoreStub(engine), 11, 12, 13, family="fam").stored == 3
            replicate = kvstore_pb2.ReplicateRequest(order=common_pb2.ReplicationOrder(
                family="fam", block_hashes=[11], source_node="node-b", target_node="node-a",
                target_address="127.0.0.1:1"))
            assert code_of(lambda: kv.Replicate(replicate, timeout=TIMEOUT)) == grpc.StatusCode.PERMISSION_DENIED
        with stub_as(scheduler.address, certs.admin) as admin:
            route = scheduler_pb2.RouteRequest(request_id="r1", block_hashes=[11, 12, 13], prompt_tokens=64,
                                               family="fam")
            assert wait_until(lambda: admin.Route(route, timeout=TIMEOUT).cached_blocks == 3)
            assert admin.Route(route, timeout=TIMEOUT).node_id == "node-b"


def test_reload_model_needs_the_admin(certs, tmp_path):
    write_manifest(tmp_path / "good", {"kind": "ewma", "version": "v2", "horizons_s": [2, 4], "quantile": 0.5,
                                        "halflife_s": 5})
    config = PredictorConfig(port=0, grace_s=1.0, workers=8, model_root=str(tmp_path),
                             **_flags(certs.service("predictor")))
    config.validate()
    server = build_predictor(config, build_telemetry("predictor", {})).start()
    request = predictor_pb2.ReloadModelRequest(name="good")
    try:
        for who in (certs.service("scheduler"), certs.node("node-a")):
            with open_channel(server.address, None, tls=who.load(), peer_role="predictor") as channel:
                stub = predictor_pb2_grpc.PredictorStub(channel)
                assert code_of(lambda: stub.ReloadModel(request, timeout=TIMEOUT)) \
                    == grpc.StatusCode.PERMISSION_DENIED
                assert stub.GetModelInfo(predictor_pb2.ModelInfoRequest(), timeout=TIMEOUT).version != "v2"
        with open_channel(server.address, None, tls=certs.admin.load(), peer_role="predictor") as channel:
            assert predictor_pb2_grpc.PredictorStub(channel).ReloadModel(request, timeout=TIMEOUT).version == "v2"
    finally:
        server.stop(grace_s=0.5)


def test_a_service_certificate_must_name_the_service(certs):
    config = SchedulerConfig(engine_profile="tiny", **_flags(certs.service("predictor")))
    with pytest.raises(InvalidArgument, match="names spiffe://speckv/service/predictor, not a scheduler identity"):
        build_scheduler(config, build_telemetry("scheduler", {}))


def test_a_non_loopback_host_without_tls_is_refused_at_start(capsys):
    assert cli.main(["scheduler", "--host", "0.0.0.0", "--port", "0", "--engine-profile", "tiny"], {}) == 2
    assert "host='0.0.0.0': without TLS a service binds loopback only" in capsys.readouterr().err
    # A config built without validate() is refused by the server itself.
    with pytest.raises(InvalidArgument, match="without TLS a service binds loopback only"):
        build_scheduler(SchedulerConfig(engine_profile="tiny", host="0.0.0.0"), build_telemetry("scheduler", {}))


def test_insecure_serves_plaintext_beyond_loopback_with_a_loud_warning(caplog):
    settings = ServerSettings(host="0.0.0.0", insecure=True, grace_s=0.5)
    with caplog.at_level(logging.WARNING):
        server = ServiceServer("demo", settings, build_telemetry("demo", {}), lambda _server: []).start()
    try:
        assert any("PLAINTEXT" in r.getMessage() and "--insecure" in r.getMessage() for r in caplog.records)
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT) \
                .status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(grace_s=0.5)
