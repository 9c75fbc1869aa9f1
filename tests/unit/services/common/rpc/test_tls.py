"""Certificates (certs.py), the identity scheme and TLS file checks (tls.py),
and the TLS and loopback rules of ServerSettings: all without a server."""
from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest
from cryptography import x509

from speckv.services import cli
from speckv.services.cluster.certs import bundle_complete, make_bundle
from speckv.services.common.config import parse_config
from speckv.services.common.errors import InvalidArgument
from speckv.services.common.rpc.server import ServerSettings
from speckv.services.common.rpc.tls import (
    ADMIN,
    ClientTlsSettings,
    Identity,
    Role,
    TlsFiles,
    certificate_identities,
    is_loopback,
)
from speckv.services.kvstore.config import KVStoreConfig

NODES = ["node-0", "node-1"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return make_bundle(tmp_path_factory.mktemp("tls"), NODES)


def _cert(files: TlsFiles) -> x509.Certificate:
    return x509.load_pem_x509_certificate(Path(files.cert).read_bytes())


def test_bundle_has_one_identity_per_process_and_private_keys(bundle):
    assert set(bundle.files) == {ADMIN, Identity.service("scheduler"), Identity.service("predictor"),
                                 *(Identity.node(n) for n in NODES), *(Identity.engine(n) for n in NODES)}
    for identity, files in bundle.files.items():
        assert files.load().identity == identity
        assert certificate_identities(_cert(files)) == [identity]
        assert stat.S_IMODE(Path(files.key).stat().st_mode) == 0o600
    keys = [p for p in bundle.root.rglob("*") if p.is_file() and b"PRIVATE KEY" in p.read_bytes()]
    # the CA's key is not kept; etcd's is the one key outside the speckv identities
    assert sorted(keys) == sorted([*(Path(f.key) for f in bundle.files.values()), Path(bundle.etcd.key)])


def test_server_certificates_name_their_role_and_loopback_and_the_admin_is_a_client_only(bundle):
    def dns(files: TlsFiles) -> list[str]:
        return _cert(files).extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
            .get_values_for_type(x509.DNSName)

    assert dns(bundle.service("scheduler")) == ["scheduler.speckv", "localhost"]
    assert dns(bundle.node("node-0"))[0] == "kvstore.speckv"
    assert dns(bundle.admin) == []
    usage = _cert(bundle.admin).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]


@pytest.mark.parametrize("uri, expected", [
    ("spiffe://speckv/admin", ADMIN),
    ("spiffe://speckv/node/node-7", Identity(Role.NODE, "node-7")),
    ("spiffe://speckv/service/scheduler", Identity(Role.SERVICE, "scheduler")),
    ("spiffe://speckv/service/kvstore", None),  # not a service name
    ("spiffe://speckv/node/", None),
    ("spiffe://speckv/node/a/b", None),
    ("spiffe://speckv/unknown", None),
    ("spiffe://other/admin", None),  # another trust domain
    ("https://speckv/admin", None),
])
def test_identity_parsing(uri, expected):
    assert Identity.parse(uri) == expected
    if expected is not None:
        assert expected.uri == uri


def test_node_ids_outside_the_alphabet_are_refused():
    with pytest.raises(InvalidArgument, match="node id 'a/b'"):
        Identity.node("a/b")
    with pytest.raises(InvalidArgument, match="twice"):
        make_bundle(Path("/nonexistent"), ["a", "a"])


def test_partial_tls_settings_name_what_is_missing():
    assert TlsFiles.from_settings("", "", "") is None
    with pytest.raises(InvalidArgument, match="tls_key, tls_ca: TLS needs all of"):
        TlsFiles.from_settings("cert.pem", "", "")


def test_bad_files_give_errors_naming_the_file(bundle, tmp_path):
    node = bundle.node("node-0")
    with pytest.raises(InvalidArgument, match=f"tls_cert={tmp_path}/absent.pem: cannot read it"):
        TlsFiles(str(tmp_path / "absent.pem"), node.key, node.ca).load()
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(InvalidArgument, match=f"tls_cert={garbage}: not a PEM certificate"):
        TlsFiles(str(garbage), node.key, node.ca).load()
    with pytest.raises(InvalidArgument, match=f"tls_ca={garbage}: not a PEM certificate"):
        TlsFiles(node.cert, node.key, str(garbage)).load()
    with pytest.raises(InvalidArgument, match=f"tls_key={garbage}: not an unencrypted PEM private key"):
        TlsFiles(node.cert, str(garbage), node.ca).load()
    other = bundle.node("node-1")
    with pytest.raises(InvalidArgument, match=f"tls_key={other.key}: not the private key of tls_cert={node.cert}"):
        TlsFiles(node.cert, other.key, node.ca).load()


def test_a_certificate_of_another_ca_or_out_of_date_is_refused(bundle, tmp_path):
    stranger = make_bundle(tmp_path / "other", ["node-0"]).node("node-0")
    with pytest.raises(InvalidArgument, match="not signed by the CA in tls_ca="):
        TlsFiles(stranger.cert, stranger.key, bundle.node("node-0").ca).load()
    old = make_bundle(tmp_path / "old", [], days=1, now=dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)).admin
    with pytest.raises(InvalidArgument, match=r"tls_ca=.*: valid only from 2019-12-31 23:55 to 2020-01-02"):
        old.load()


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True),
                                            ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False),
                                            ("10.0.0.5", False), ("node-0", False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_without_tls_a_non_loopback_host_needs_insecure(bundle):
    with pytest.raises(InvalidArgument, match=r"host='0.0.0.0': without TLS a service binds loopback only"):
        parse_config(ServerSettings, ["--host", "0.0.0.0"], {}, prog="t")
    assert parse_config(ServerSettings, ["--host", "0.0.0.0", "--insecure"], {}, prog="t").insecure
    assert parse_config(ServerSettings, ["--host", "0.0.0.0"], {"SPECKV_INSECURE": "true"}, prog="t").insecure
    files = bundle.service("scheduler")
    env = {"SPECKV_TLS_CERT": files.cert, "SPECKV_TLS_KEY": files.key, "SPECKV_TLS_CA": files.ca}
    config = parse_config(ServerSettings, ["--host", "0.0.0.0"], env, prog="t")
    assert config.tls().identity == Identity.service("scheduler")
    flags = parse_config(ServerSettings, ["--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca],
                         {}, prog="t")
    assert flags.tls_files() == TlsFiles(files.cert, files.key, files.ca)
    with pytest.raises(InvalidArgument, match="tls_ca: TLS needs all of"):
        parse_config(ServerSettings, ["--tls-cert", files.cert, "--tls-key", files.key], {}, prog="t")


def test_a_kvstore_refuses_a_certificate_of_another_node(bundle):
    files = bundle.node("node-1")
    argv = ["--node-id", "node-0", "--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca]
    with pytest.raises(InvalidArgument, match="proves spiffe://speckv/node/node-1, not node_id='node-0'"):
        parse_config(KVStoreConfig, argv, {}, prog="t")
    assert parse_config(KVStoreConfig, ["--node-id", "node-1", *argv[2:]], {}, prog="t").tls() is not None


def test_client_tools_take_the_same_flags_and_variables(bundle):
    files = bundle.admin
    env = {"SPECKV_TLS_CERT": files.cert, "SPECKV_TLS_KEY": files.key, "SPECKV_TLS_CA": files.ca}
    assert parse_config(ClientTlsSettings, [], env, prog="t").load().identity == ADMIN
    assert parse_config(ClientTlsSettings, [], {}, prog="t").load() is None


def test_certs_command_writes_a_bundle_and_keeps_a_complete_one(tmp_path, capsys):
    out = tmp_path / "certs"
    assert cli.main(["certs", "--out", str(out), "--nodes", "a,b"], {}) == 0
    assert bundle_complete(out, ["a", "b"]) and not bundle_complete(out, ["a", "b", "c"])
    ca = (out / "ca.pem").read_bytes()
    assert cli.main(["certs", "--out", str(out), "--nodes", "a,b", "--if-missing"], {}) == 0
    assert (out / "ca.pem").read_bytes() == ca and "kept" in capsys.readouterr().out
    assert cli.main(["certs", "--out", str(out), "--nodes", "a,b,c", "--if-missing"], {}) == 0
    assert (out / "ca.pem").read_bytes() != ca and bundle_complete(out, ["a", "b", "c"])


def test_an_engine_certificate_names_its_node_and_is_a_client_only(bundle):
    engine = bundle.engine(NODES[0])
    assert engine.load().identity == Identity.engine(NODES[0]) == Identity.parse(f"spiffe://speckv/engine/{NODES[0]}")
    assert Identity.engine(NODES[0]).server_name == ""
    assert Identity.parse("spiffe://speckv/engine/../x") is None


def test_etcds_certificate_serves_and_dials_etcd_and_is_no_speckv_identity(bundle):
    cert = _cert(bundle.etcd)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["etcd.speckv", "localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # both: etcd's gRPC gateway dials etcd itself with it when etcd runs --client-cert-auth
    assert set(usage) == {x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH}
    assert certificate_identities(cert) == []  # no speckv service takes it as anyone
    with pytest.raises(InvalidArgument, match="names 0 speckv identities"):
        bundle.etcd.load()
    assert stat.S_IMODE(Path(bundle.etcd.key).stat().st_mode) == 0o600
