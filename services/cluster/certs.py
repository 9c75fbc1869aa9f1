"""A throwaway local CA and per-process certificates for mutual TLS
(`speckv certs`, `speckv up --tls`, the compose `tls` profile).

Operator tooling, beside `speckv up` (which calls it with --tls): the compose
certs container runs it from the service image, so it needs only what a
service install has (cryptography, as tls.py does), never the lab.

Layout under the output folder (every key file mode 0600):

    ca.pem                          the CA certificate (its key is never written)
    admin/{cert,key}.pem            spiffe://speckv/admin (client only)
    scheduler/{cert,key}.pem        spiffe://speckv/service/scheduler
    predictor/{cert,key}.pem        spiffe://speckv/service/predictor
    node/<id>/{cert,key}.pem        spiffe://speckv/node/<id>
    etcd/{cert,key}.pem             the scheduler replicas' etcd (`speckv etcd --tls-*`): DNS etcd.speckv
                                    and loopback, server and client auth (etcd's gateway dials etcd
                                    with it); no speckv identity, so no speckv service accepts it

The CA's private key lives only in memory while the bundle is made, so no
one can mint another identity later: adding a node means a new bundle (or
certificates from an operator's own CA, any CA works: common/rpc/tls.py checks only the
identity URI, the signature and the validity). Keys are ECDSA P-256, cheap
to make and to handshake with.
"""
from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from speckv.services.common.errors import InvalidArgument
from speckv.services.common.rpc.tls import ADMIN, SERVICES, Identity, TlsFiles

DEFAULT_DAYS = 30
# Every server certificate also answers to loopback, so a client that dials
# 127.0.0.1 without naming the role it expects still verifies (speckv health).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ETCD_DIR = "etcd"
ETCD_SERVER_NAME = "etcd.speckv"
_CLOCK_SKEW = dt.timedelta(minutes=5)  # backdated so a peer whose clock lags a little accepts it


@dataclass(frozen=True, slots=True)
class CertBundle:
    """Where make_bundle wrote each identity's files."""

    root: Path
    files: Mapping[Identity, TlsFiles] = field(default_factory=dict)
    # The CA's key and certificate, in memory only (never written): what issue_node signs with.
    authority: tuple[ec.EllipticCurvePrivateKey, x509.Certificate, int] | None = field(
        default=None, compare=False, repr=False)

    @property
    def ca(self) -> Path:
        return self.root / "ca.pem"

    def of(self, identity: Identity) -> TlsFiles:
        if identity not in self.files:
            raise InvalidArgument(f"{self.root}: no certificate for {identity}")
        return self.files[identity]

    def node(self, node_id: str) -> TlsFiles:
        return self.of(Identity.node(node_id))

    def engine(self, node_id: str) -> TlsFiles:
        """The certificate of node_id's inference engine (its connector)."""
        return self.of(Identity.engine(node_id))

    def service(self, name: str) -> TlsFiles:
        return self.of(Identity.service(name))

    @property
    def admin(self) -> TlsFiles:
        return self.of(ADMIN)

    @property
    def etcd(self) -> TlsFiles:
        """etcd's server certificate (module docstring)."""
        return TlsFiles(str(self.root / ETCD_DIR / "cert.pem"), str(self.root / ETCD_DIR / "key.pem"), str(self.ca))


def identity_dir(root: Path, identity: Identity) -> Path:
    if identity.role.value in ("node", "engine"):
        return root / identity.role.value / identity.name
    return root / (identity.name or identity.role.value)


def make_bundle(out: Path, nodes: Sequence[str], hosts: Sequence[str] = (), days: int = DEFAULT_DAYS,
                now: dt.datetime | None = None) -> CertBundle:
    """A fresh CA and certificates for the admin, the scheduler, the
    predictor, each node id and each node's engine, written under out (created if missing;
    files of an earlier bundle there are replaced). hosts: extra DNS names
    or IPs every server certificate also carries (compose service names)."""
    if days < 1:
        raise InvalidArgument(f"days={days}: must be >= 1")
    if len(set(nodes)) != len(nodes):
        raise InvalidArgument(f"nodes {list(nodes)}: a node id appears twice")
    identities = [ADMIN, *(Identity.service(s) for s in SERVICES), *(Identity.node(n) for n in nodes),
                  *(Identity.engine(n) for n in nodes)]
    now = now or dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "speckv local CA"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "speckv")])
    ca_cert = (_builder(ca_name, ca_name, ca_key.public_key(), now, days)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False, key_agreement=False,
                                            key_cert_sign=True, crl_sign=True, encipher_only=False,
                                            decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    out.mkdir(parents=True, exist_ok=True)
    ca_path = out / "ca.pem"
    _write(ca_path, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    files = {identity: _issue(out, identity, ca_key, ca_cert, hosts, now, days) for identity in identities}
    _issue_etcd(out, ca_key, ca_cert, hosts, now, days)
    return CertBundle(out, files, (ca_key, ca_cert, days))


def issue_node(bundle: CertBundle, node_id: str, hosts: Sequence[str] = ()) -> CertBundle:
    """The bundle with a certificate for one more node (and its engine), signed by the same
    CA (a node added to a running cluster). Only a bundle make_bundle made
    in this process can (its CA key lives in memory only)."""
    if bundle.authority is None:
        raise InvalidArgument(f"{bundle.root}: no CA key in this process; cannot issue a certificate for {node_id}")
    identity = Identity.node(node_id)
    if identity in bundle.files:
        raise InvalidArgument(f"{bundle.root}: node {node_id} has a certificate already")
    ca_key, ca_cert, days = bundle.authority
    now = dt.datetime.now(dt.timezone.utc)
    files = {**bundle.files, identity: _issue(bundle.root, identity, ca_key, ca_cert, hosts, now, days),
             Identity.engine(node_id): _issue(bundle.root, Identity.engine(node_id), ca_key, ca_cert, hosts, now,
                                              days)}
    return CertBundle(bundle.root, files, bundle.authority)


def _issue(out: Path, identity: Identity, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
           hosts: Sequence[str], now: dt.datetime, days: int) -> TlsFiles:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _leaf(identity, key, ca_key, ca_cert, hosts, now, days)
    folder = identity_dir(out, identity)
    _write_pair(folder, cert, key)
    return TlsFiles(str(folder / "cert.pem"), str(folder / "key.pem"), str(out / "ca.pem"))


def _write_pair(folder: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / "cert.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(folder / "key.pem", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()), 0o600)


def _issue_etcd(out: Path, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, hosts: Sequence[str],
                now: dt.datetime, days: int) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    names = [_general_name(h) for h in dict.fromkeys([ETCD_SERVER_NAME, *LOOPBACK_NAMES, *hosts])]
    cert = _sign("speckv etcd", names, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], key,
                 ca_key, ca_cert, now, days)
    _write_pair(out / ETCD_DIR, cert, key)


def bundle_complete(out: Path, nodes: Sequence[str]) -> bool:
    """out holds the CA and a certificate and key for each identity make_bundle would write."""
    identities = [ADMIN, *(Identity.service(s) for s in SERVICES), *(Identity.node(n) for n in nodes),
                  *(Identity.engine(n) for n in nodes)]
    folders = [identity_dir(out, i) for i in identities] + [out / ETCD_DIR]
    return (out / "ca.pem").is_file() and all(
        (folder / name).is_file() for folder in folders for name in ("cert.pem", "key.pem"))


def _leaf(identity: Identity, key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey,
          ca_cert: x509.Certificate, hosts: Sequence[str], now: dt.datetime, days: int) -> x509.Certificate:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)]
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if identity.server_name:  # the admin is a client only
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        names += [_general_name(h) for h in dict.fromkeys([identity.server_name, *LOOPBACK_NAMES, *hosts])]
    return _sign(identity.uri[:64], names, usages, key, ca_key, ca_cert, now, days)


def _sign(common_name: str, names: list[x509.GeneralName], usages: list[x509.ObjectIdentifier],
          key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
          now: dt.datetime, days: int) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "speckv")])
    return (_builder(subject, ca_cert.subject, key.public_key(), now, days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: dt.datetime,
             days: int) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def _write(path: Path, data: bytes, mode: int) -> None:
    # Created with its final mode, so a key is never readable by others, even briefly.
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """`speckv certs`: write a bundle (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="speckv certs", description="Make a local CA and mutual-TLS "
                                     "certificates for the admin, scheduler, predictor, each node and "
                                     "each node's engine.")
    parser.add_argument("--out", required=True, help="folder to write into (created if missing)")
    parser.add_argument("--nodes", default="", help="node ids, comma-separated (e.g. node-0,node-1)")
    parser.add_argument("--host", action="append", default=[],
                        help="an extra DNS name or IP every server certificate carries (repeatable)")
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS, help=f"validity (default {DEFAULT_DAYS})")
    parser.add_argument("--if-missing", action="store_true",
                        help="keep a bundle already in --out that has every file asked for (a compose restart "
                             "must not replace the CA under running services)")
    args = parser.parse_args(list(argv))
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    out = Path(args.out)
    if args.if_missing and bundle_complete(out, nodes):
        print(f"{out}: every certificate is there; kept", flush=True)
        return 0
    bundle = make_bundle(out, nodes, args.host, args.days)
    for identity, files in bundle.files.items():
        print(f"{identity.uri}: {files.cert}")
    print(f"etcd (server): {bundle.etcd.cert}")
    print(f"CA: {bundle.ca} (its key was not kept)", flush=True)
    return 0
