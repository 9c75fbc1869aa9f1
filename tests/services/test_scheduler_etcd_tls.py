"""Scheduler replicas on a real etcd serving TLS with the certificates
`speckv certs` makes (etcd/ for etcd, the scheduler's for its client): a
client without a certificate, with one from another CA, or speaking plain
http is refused; with the scheduler's the election and the shared state
work."""
from __future__ import annotations

import time
import uuid

import pytest

from speckv.services.cluster.certs import make_bundle
from speckv.services.cluster.etcd_process import ServerTls
from speckv.services.common.errors import Unavailable
from speckv.services.scheduler.leadership.adapters.etcd_keys import EtcdKeys, EtcdTls
from speckv.services.scheduler.leadership.etcd_elector import EtcdElector
from speckv.services.scheduler.leadership.state_store import EtcdStateStore
from tests.support.etcd import running_etcd

LEASE_S = 2
WAIT_S = 60.0


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory):
    root = tmp_path_factory.mktemp("etcd-tls")
    bundle = make_bundle(root / "certs", [])
    files = bundle.etcd
    with running_etcd(root / "etcd", ServerTls(files.cert, files.key, files.ca)) as server:
        yield server, bundle


def scheduler_tls(bundle) -> EtcdTls:
    files = bundle.service("scheduler")
    return EtcdTls(files.ca, files.cert, files.key)


def test_a_client_without_the_clusters_certificate_is_refused(tls_etcd, tmp_path):
    server, bundle = tls_etcd
    assert server.endpoint.startswith("https://")
    other = make_bundle(tmp_path / "other", []).service("scheduler")  # a certificate another CA signed
    for tls in (EtcdTls(ca=str(bundle.ca)), EtcdTls(str(bundle.ca), other.cert, other.key)):
        with pytest.raises(Unavailable, match="no member answered") as refused:
            EtcdKeys(server.endpoint, timeout_s=2.0, tls=tls).grant(LEASE_S)
        # etcd ended the handshake; this client did trust etcd's certificate
        assert "SSLError" in str(refused.value) and "CERTIFICATE_VERIFY_FAILED" not in str(refused.value)
    plain = server.endpoint.replace("https://", "http://")
    with pytest.raises(Unavailable):
        EtcdKeys(plain, timeout_s=2.0).grant(LEASE_S)


def test_an_unknown_etcd_certificate_is_refused_by_the_client(tls_etcd, tmp_path):
    server, bundle = tls_etcd
    other_ca = make_bundle(tmp_path / "other", []).ca  # etcd's certificate is not this CA's
    own = bundle.service("scheduler")
    with pytest.raises(Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
        EtcdKeys(server.endpoint, timeout_s=2.0, tls=EtcdTls(str(other_ca), own.cert, own.key)).grant(LEASE_S)


def test_with_the_schedulers_certificate_the_election_and_the_state_work(tls_etcd):
    server, bundle = tls_etcd
    cluster = f"t-{uuid.uuid4().hex[:8]}"
    electors = [EtcdElector(EtcdKeys(server.endpoint, timeout_s=1.0, tls=scheduler_tls(bundle)), cluster, name,
                            f"{name}:50051", lease_s=LEASE_S) for name in ("a", "b")]
    for elector in electors:
        elector.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while sum(e.current().is_leader for e in electors) != 1:
            assert time.monotonic() < deadline, "no single leader over TLS"
            time.sleep(0.02)
        leader = next(e for e in electors if e.current().is_leader)
        store = EtcdStateStore(EtcdKeys(server.endpoint, tls=scheduler_tls(bundle)), cluster)
        store.fence(leader.current().epoch)
        store.policy_set("reactive-heat")
        assert store.load().policy == "reactive-heat"
    finally:
        for elector in electors:
            elector.stop()
