"""The etcd endpoint list and TLS files: what parses, what is refused and why."""
from __future__ import annotations

import pytest

from speckv.services.common.errors import InvalidArgument
from speckv.services.scheduler.leadership.adapters.etcd_endpoints import (
    Endpoint, EtcdTls, parse_endpoint, parse_endpoints)


@pytest.mark.parametrize("endpoint, expected", [
    ("http://127.0.0.1:2379", ("127.0.0.1", 2379)),
    ("127.0.0.1:2379", ("127.0.0.1", 2379)),
    ("etcd.local:12", ("etcd.local", 12)),
    ("http://[::1]:2379/", ("::1", 2379)),
    ("https://etcd-0.etcd:2379", ("etcd-0.etcd", 2379)),
])
def test_endpoints_parse(endpoint, expected):
    assert parse_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["", "127.0.0.1", "ftp://h:1", "http://h:x", "http://h:1/v3", "h:99999"])
def test_bad_endpoints_are_refused_naming_them(endpoint):
    with pytest.raises(InvalidArgument, match="etcd endpoint"):
        parse_endpoint(endpoint)


def test_a_list_keeps_its_order_drops_blanks_and_repeats_and_prints_urls():
    members = parse_endpoints("https://a:1, ,https://b:2,https://a:1")
    assert members == (Endpoint("https", "a", 1), Endpoint("https", "b", 2))
    assert [m.url for m in parse_endpoints(["[::1]:5"])] == ["http://[::1]:5"]


@pytest.mark.parametrize("spec, why", [
    ("", "none given"),
    (" , ", "none given"),
    ("http://a:1,https://b:2", "mix http and https"),
    ("a:1,bad", "etcd endpoint 'bad'"),
])
def test_bad_lists_are_refused_saying_why(spec, why):
    with pytest.raises(InvalidArgument, match=why):
        parse_endpoints(spec)


def test_tls_files_beside_http_endpoints_are_refused():
    with pytest.raises(InvalidArgument, match="are http"):
        parse_endpoints("http://a:1", EtcdTls(ca="/ca.pem"))
    assert parse_endpoints("https://a:1", EtcdTls(ca="/ca.pem"))  # paths are checked by check()


def test_tls_checks_the_pair_and_the_files(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    EtcdTls(ca=str(ca)).check()
    with pytest.raises(InvalidArgument, match="give both"):
        EtcdTls(ca=str(ca), cert=str(ca)).check()
    with pytest.raises(InvalidArgument, match="etcd_key=.*no such file"):
        EtcdTls(cert=str(ca), key=str(tmp_path / "missing.pem")).check()
    assert EtcdTls().empty and not EtcdTls(ca=str(ca)).empty
