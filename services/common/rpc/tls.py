"""Mutual TLS for every gRPC server and client, and the identity a peer's
certificate proves. Pure: no servicer imports this for anything but
`peer_identity`; cert generation lives in services/cluster/certs.py.

Identity scheme (docs/security.md): every certificate of a speckv cluster is
signed by the cluster's CA and carries exactly one SPIFFE-style URI SAN:

    spiffe://speckv/node/<node id>       a kvstore (its node id)
    spiffe://speckv/engine/<node id>     the inference engine beside that kvstore (its connector)
    spiffe://speckv/service/<name>       scheduler | predictor
    spiffe://speckv/admin                an operator (CLI, benchmarks, tests)

Server certificates also carry the DNS name `<role>.speckv` (role: scheduler,
predictor, kvstore), which clients that know whom they dial verify instead
of the address (`ssl_target_name_override`), so a node's certificate cannot
stand in for the scheduler's, whatever address either is reached at.

Invariant: a server serves either TLS (every client presents a certificate
the CA signed) or plaintext, never both, so "the call came over TLS" is
"identity checks are on" (authz.py relies on it).
"""
from __future__ import annotations

import datetime as dt
import enum
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from speckv.services.common.errors import InvalidArgument

TRUST_DOMAIN = "speckv"
URI_PREFIX = f"spiffe://{TRUST_DOMAIN}/"
# Node ids go into a URI path and a file name: keep them to a safe alphabet.
NODE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SERVICES = ("scheduler", "predictor")
ROLES = ("scheduler", "predictor", "kvstore")  # what a client may expect the server to be


class Role(enum.Enum):
    NODE = "node"
    ENGINE = "engine"  # a node's inference engine (the vLLM connector): reads and writes that node's blocks
    SERVICE = "service"
    ADMIN = "admin"
    UNKNOWN = "unknown"  # a TLS peer whose certificate names no single speckv identity: matches no rule


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a certificate says its holder is. name: the node id (NODE, and
    ENGINE: the node whose engine it is), the service name (SERVICE), ""
    (ADMIN)."""

    role: Role
    name: str = ""

    @property
    def uri(self) -> str:
        if self.role in (Role.ADMIN, Role.UNKNOWN):
            return URI_PREFIX + self.role.value
        return URI_PREFIX + f"{self.role.value}/{self.name}"

    @property
    def server_name(self) -> str:
        """The DNS SAN a server with this identity carries ("" for admin: client only)."""
        if self.role is Role.NODE:
            return server_name("kvstore")
        return server_name(self.name) if self.role is Role.SERVICE else ""

    def __str__(self) -> str:
        return self.uri

    @staticmethod
    def node(node_id: str) -> "Identity":
        check_node_id(node_id)
        return Identity(Role.NODE, node_id)

    @staticmethod
    def engine(node_id: str) -> "Identity":
        check_node_id(node_id)
        return Identity(Role.ENGINE, node_id)

    @staticmethod
    def service(name: str) -> "Identity":
        if name not in SERVICES:
            raise InvalidArgument(f"service {name!r}: expected one of {', '.join(SERVICES)}")
        return Identity(Role.SERVICE, name)

    @staticmethod
    def parse(uri: str) -> "Identity | None":
        """The identity a URI SAN names, or None when it is not one of ours."""
        if not uri.startswith(URI_PREFIX):
            return None
        rest = uri[len(URI_PREFIX):]
        if rest == Role.ADMIN.value:
            return Identity(Role.ADMIN)
        kind, _, name = rest.partition("/")
        if kind == Role.NODE.value and NODE_ID_PATTERN.match(name):
            return Identity(Role.NODE, name)
        if kind == Role.ENGINE.value and NODE_ID_PATTERN.match(name):
            return Identity(Role.ENGINE, name)
        if kind == Role.SERVICE.value and name in SERVICES:
            return Identity(Role.SERVICE, name)
        return None


ADMIN = Identity(Role.ADMIN)


def server_name(role: str) -> str:
    return f"{role}.{TRUST_DOMAIN}"


def check_node_id(node_id: str) -> None:
    if not NODE_ID_PATTERN.match(node_id):
        raise InvalidArgument(f"node id {node_id!r}: a certificate names node ids of letters, digits, '.', '_' "
                              "and '-' only (at most 128, starting with a letter or digit)")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The three PEM files of one process: its certificate, its private key
    and the CA that signed every certificate of the cluster."""

    cert: str
    key: str
    ca: str

    @staticmethod
    def from_settings(cert: str, key: str, ca: str) -> "TlsFiles | None":
        """None when all three are empty (TLS off); InvalidArgument naming the
        missing ones when only some are set."""
        given = {"tls_cert": cert, "tls_key": key, "tls_ca": ca}
        if not any(given.values()):
            return None
        missing = [name for name, value in given.items() if not value]
        if missing:
            raise InvalidArgument(f"{', '.join(missing)}: TLS needs all of tls_cert, tls_key and tls_ca "
                                  f"(set: {', '.join(n for n in given if n not in missing)})")
        return TlsFiles(cert, key, ca)

    def load(self, now: dt.datetime | None = None) -> "TlsMaterial":
        """Reads and checks the files: each parses, the key is the
        certificate's, the CA signed the certificate, both are within their
        validity, and the certificate names one speckv identity. Every error
        is InvalidArgument naming the file."""
        now = now or dt.datetime.now(dt.timezone.utc)
        cert_pem, key_pem, ca_pem = _read(self.cert, "tls_cert"), _read(self.key, "tls_key"), _read(self.ca, "tls_ca")
        cert = _certificate(cert_pem, self.cert, "tls_cert")
        ca = _certificate(ca_pem, self.ca, "tls_ca")
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"tls_key={self.key}: not an unencrypted PEM private key ({exc})") from None
        if key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) \
                != cert.public_key().public_bytes(serialization.Encoding.DER,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo):
            raise InvalidArgument(f"tls_key={self.key}: not the private key of tls_cert={self.cert}")
        for pem_cert, path, name in ((ca, self.ca, "tls_ca"), (cert, self.cert, "tls_cert")):
            if not pem_cert.not_valid_before_utc <= now <= pem_cert.not_valid_after_utc:
                raise InvalidArgument(f"{name}={path}: valid only from {pem_cert.not_valid_before_utc:%Y-%m-%d %H:%M} "
                                      f"to {pem_cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if not _signed_by(cert, ca):
            raise InvalidArgument(f"tls_cert={self.cert}: not signed by the CA in tls_ca={self.ca}")
        identities = certificate_identities(cert)
        if len(identities) != 1:
            raise InvalidArgument(f"tls_cert={self.cert}: names {len(identities)} speckv identities, needs exactly "
                                  f"one URI SAN {URI_PREFIX}node/<id>, {URI_PREFIX}service/<name> or {ADMIN.uri}")
        return TlsMaterial(cert_pem, key_pem, ca_pem, identities[0])


@dataclass(frozen=True, slots=True)
class ClientTlsSettings:
    """The TLS flags of a tool that only calls services (speckv status,
    health, bench): config.add_config_arguments makes --tls-cert/--tls-key/
    --tls-ca and SPECKV_TLS_* of them, as ServerSettings' fields of the same
    names do for services. All empty: plaintext."""

    tls_cert: str = field(default="", metadata={"help": "client certificate (PEM) for mutual TLS"})
    tls_key: str = field(default="", metadata={"help": "the private key of tls_cert (PEM)"})
    tls_ca: str = field(default="", metadata={"help": "the CA certificate (PEM) that signed the servers'"})

    def validate(self) -> None:
        TlsFiles.from_settings(self.tls_cert, self.tls_key, self.tls_ca)

    def files(self) -> TlsFiles | None:
        return TlsFiles.from_settings(self.tls_cert, self.tls_key, self.tls_ca)

    def load(self) -> "TlsMaterial | None":
        files = self.files()
        return files.load() if files is not None else None


def dial(address: str, tls: "TlsMaterial | None", peer_role: str = "",
         options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A plain channel of a tool (no telemetry): mutual TLS with tls, else plaintext."""
    if tls is None:
        return grpc.insecure_channel(address, options=list(options))
    return tls.secure_channel(address, options, peer_role)


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """Loaded, checked TLS files and the identity they prove."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    identity: Identity

    def server_credentials(self) -> grpc.ServerCredentials:
        """Mutual TLS: the handshake fails for a client without a certificate the CA signed."""
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca_pem, private_key=self.key_pem,
                                            certificate_chain=self.cert_pem)

    def secure_channel(self, address: str, options: Sequence[tuple[str, Any]], peer_role: str = "") -> grpc.Channel:
        """A channel presenting this certificate. peer_role (one of ROLES):
        the server must prove that role's DNS name; "" checks the address's
        host against the server certificate's names instead."""
        if peer_role and peer_role not in ROLES:
            raise InvalidArgument(f"peer_role={peer_role!r}: expected one of {', '.join(ROLES)} or empty")
        extra = [("grpc.ssl_target_name_override", server_name(peer_role))] if peer_role else []
        return grpc.secure_channel(address, self.channel_credentials(), options=[*options, *extra])


def certificate_identities(cert: x509.Certificate) -> list[Identity]:
    """The speckv identities among cert's URI SANs."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    found = (Identity.parse(uri) for uri in san.get_values_for_type(x509.UniformResourceIdentifier))
    return [i for i in found if i is not None]


def peer_identity(context: grpc.ServicerContext) -> Identity | None:
    """The identity the caller's certificate proves; None when the call did
    not come over TLS (identity checks off: tls.py's invariant). A TLS call
    whose certificate names no single speckv identity yields UNKNOWN_PEER,
    which matches no rule, so authz denies it."""
    auth = getattr(context, "auth_context", None)
    properties = auth() if auth is not None else {}
    if properties.get("transport_security_type", [b""])[0] != b"ssl":
        return None
    # grpc lists every SAN (DNS, URI, IP) as text under this key.
    names = properties.get("x509_subject_alternative_name", [])
    identities = {i for i in (Identity.parse(n.decode(errors="replace")) for n in names) if i is not None}
    return identities.pop() if len(identities) == 1 else UNKNOWN_PEER


# Cannot happen with cluster/certs.py's certificates; another certificate the CA signed might.
UNKNOWN_PEER = Identity(Role.UNKNOWN)


LOOPBACK_HOSTS = ("localhost", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    """host (as --host takes it) binds loopback only."""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def _read(path: str, name: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"{name}={path}: cannot read it ({exc.strerror or exc})") from None


def _certificate(pem: bytes, path: str, name: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise InvalidArgument(f"{name}={path}: not a PEM certificate ({exc})") from None


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
