"""SchedulerConfig's replica flags: --etcd, --peers (static and dns:
entries), --replica-id and --advertise-address, and what they refuse."""
from __future__ import annotations

import pytest

from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument
from speckv.services.scheduler.adapters.config import SchedulerConfig

ETCD = "http://127.0.0.1:2379"


def parse(argv=(), environ=None):
    return parse_config(SchedulerConfig, ["--engine-profile", "tiny", *argv], environ or {}, prog="speckv scheduler")


def test_replicas_take_static_and_dns_peers_and_an_advertised_address():
    config = parse(["--etcd", ETCD, "--peers", "10.0.0.2:50052,dns:speckv-scheduler-replicas:50052",
                    "--advertise-address", "10.0.0.1:50052", "--replica-id", "pod-a"])
    assert config.peers.endswith("dns:speckv-scheduler-replicas:50052") and config.advertise_address == "10.0.0.1:50052"
    env = parse([], {"SPECKV_ETCD": ETCD, "SPECKV_PEERS": "dns:///svc:50052", "SPECKV_ADVERTISE_ADDRESS": "[fd00::1]:1"})
    assert env.peers == "dns:///svc:50052"


@pytest.mark.parametrize("argv, message", [
    (["--etcd", ETCD, "--peers", "nohost"], "peers: 'nohost'"),
    (["--etcd", ETCD, "--peers", "dns:svc"], "expected dns:NAME:PORT"),
    (["--etcd", ETCD, "--peers", "dns://8.8.8.8/svc:1"], "authority"),
    (["--etcd", ETCD, "--advertise-address", "10.0.0.1"], "advertise_address='10.0.0.1'"),
    (["--peers", "a:1"], "need --etcd"),
    (["--advertise-address", "a:1"], "need --etcd"),
    (["--etcd", ETCD, "--state-dir", "/tmp/x"], "exclusive"),
])
def test_bad_replica_flags_are_refused_naming_the_flag(argv, message):
    with pytest.raises(InvalidArgument, match=message):
        parse(argv)


def test_etcd_takes_several_members_and_https_with_tls_files(tmp_path):
    config = parse(["--etcd", "http://10.0.0.1:2379,http://10.0.0.2:2379,10.0.0.3:2379"])
    assert config.etcd_tls.empty
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    env = parse([], {"SPECKV_ETCD": "https://e-0:2379,https://e-1:2379", "SPECKV_ETCD_CA": str(ca),
                     "SPECKV_ETCD_CERT": str(ca), "SPECKV_ETCD_KEY": str(ca)})
    assert env.etcd_tls.ca == env.etcd_tls.cert == env.etcd_tls.key == str(ca)


@pytest.mark.parametrize("argv, message", [
    (["--etcd", "http://a:1,https://b:2"], "mix http and https"),
    (["--etcd", "http://a:1", "--etcd-ca", "/ca.pem"], "are http"),
    (["--etcd", "https://a:1", "--etcd-ca", "/nonexistent/ca.pem"], "etcd_ca=/nonexistent/ca.pem: no such file"),
    (["--etcd", "https://a:1", "--etcd-cert", "/c.pem"], "give both"),
    (["--etcd-ca", "/ca.pem"], "are for --etcd"),
])
def test_bad_etcd_flags_are_refused_saying_why(argv, message):
    with pytest.raises(InvalidArgument, match=message):
        parse(argv)
