"""`speckv etcd`'s command line (etcd_process.etcd_command): one member or a
member of several, plaintext or TLS with client certificates; and its TLS
flags refused when only some are given. (etcd itself runs in tests/services.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from speckv.services.cluster import etcd_process
from speckv.services.cluster.etcd_process import ServerTls, etcd_command


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_one_member_is_its_own_cluster_in_plain_http():
    command = etcd_command("etcd", "m", Path("/d"), "127.0.0.1", 1, 2)
    assert flag(command, "--listen-client-urls") == "http://127.0.0.1:1"
    assert flag(command, "--initial-cluster") == "m=http://127.0.0.1:2"
    assert flag(command, "--initial-cluster-token") == "m"
    assert "--client-cert-auth" not in command


def test_a_member_of_several_names_them_all_and_serves_tls_with_client_certificates():
    cluster = "a=http://h:2,b=http://h:4,c=http://h:6"
    command = etcd_command("etcd", "b", Path("/d"), "h", 3, 4, initial_cluster=cluster, token="t",
                           tls=ServerTls("/c.pem", "/k.pem", "/ca.pem"))
    assert flag(command, "--initial-cluster") == cluster and flag(command, "--initial-cluster-token") == "t"
    assert flag(command, "--advertise-client-urls") == "https://h:3"
    assert flag(command, "--initial-advertise-peer-urls") == "http://h:4"
    assert (flag(command, "--cert-file"), flag(command, "--key-file"), flag(command, "--trusted-ca-file")) == (
        "/c.pem", "/k.pem", "/ca.pem")
    assert "--client-cert-auth" in command


def test_tls_flags_go_together(capsys):
    with pytest.raises(SystemExit):
        etcd_process.main(["--data-dir", "/tmp/x", "--tls-cert", "/c.pem"], {})
    assert "go together" in capsys.readouterr().err
