"""Readers of the objects deploy/k8s renders to (tests.support.kustomize):
the workloads and their speckv containers, each container's config class and
environment as the kubelet resolves it, its TLS files and the identity its
certificate must name, and cert-manager's csi-driver imitated (what it
expands and the files it writes) with a CA like examples/issuer.yaml's.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import importlib
import ipaddress
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from speckv.services import cli
from speckv.services.common.config import env_name
from speckv.services.common.rpc.server import ServerSettings
from speckv.services.common.rpc.tls import Identity
from tests.support.kustomize import WORKLOAD_KINDS, rendered

# Sample downward-API values for resolving a container's environment.
FIELD_REFS = {"metadata.name": "speckv-node-0", "metadata.namespace": "speckv", "status.podIP": "10.1.2.3"}
# The services' TLS settings (ServerSettings' fields), as variables.
TLS_VARIABLES = tuple(env_name(name) for name in ("tls_cert", "tls_key", "tls_ca"))
# cert-manager's csi-driver (github.com/cert-manager/csi-driver, pkg/apis/v1alpha1
# and pkg/apis/defaults): its driver name, the volume attributes it reads (a
# misspelt one it would ignore), the file names it writes when none is given,
# and the variables it expands (Go os.Expand) in uri-sans, dns-names and
# common-name, here for the sample pod of FIELD_REFS.
CSI_DRIVER = "csi.cert-manager.io"
CSI = "csi.cert-manager.io/"
CSI_ATTRIBUTES = {CSI + name for name in (
    "issuer-name", "issuer-kind", "issuer-group", "common-name", "dns-names", "ip-sans", "uri-sans", "duration",
    "is-ca", "key-usages", "key-algorithm", "key-encoding", "key-size", "certificate-file", "privatekey-file",
    "ca-file", "fs-group", "renew-before", "reuse-private-key")}
CSI_FILES = dict(zip(TLS_VARIABLES, (("certificate-file", "tls.crt"), ("privatekey-file", "tls.key"),
                                      ("ca-file", "ca.crt"))))
CSI_DEFAULT_USAGES = "digital signature,key encipherment"
CSI_VARIABLES = {"POD_NAME": FIELD_REFS["metadata.name"], "POD_NAMESPACE": FIELD_REFS["metadata.namespace"],
                 "POD_UID": "7b0c5f2e-0000-4000-8000-000000000000", "SERVICE_ACCOUNT_NAME": "default"}


def workloads(root: str) -> list[dict]:
    return [o for o in rendered(root) if o["kind"] in WORKLOAD_KINDS]


def speckv_containers(root: str) -> list[tuple[dict, dict]]:
    """(workload, container) for every container running the speckv image."""
    return [(w, c) for w in workloads(root) for c in w["spec"]["template"]["spec"]["containers"]
            if c["image"].rpartition("/")[2].startswith("speckv:")]


def service_of(container: dict) -> str:
    return container["args"][0]


def config_class(service: str) -> type:
    module = importlib.import_module(cli.SERVER_MODULES[service].rsplit(".", 1)[0] + ".config")
    classes = [c for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, ServerSettings) and c is not ServerSettings]
    assert len(classes) == 1, f"{module.__name__} must define one config class"
    return classes[0]


def fields_of(service: str) -> set[str]:
    return {env_name(f.name) for f in dataclasses.fields(config_class(service))}


def literal_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def resolved_env(container: dict) -> dict[str, str]:
    """The environment the kubelet gives the container: downward-API fields
    from FIELD_REFS, $(VAR) expanded from variables defined before it."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), e["value"])
        else:
            env[e["name"]] = FIELD_REFS[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def uses_tls(container: dict) -> bool:
    return any(name in literal_env(container) for name in TLS_VARIABLES)


def expected_identity(container: dict) -> Identity:
    """Who the container's certificate must say it is (services/common/rpc/tls.py):
    a kvstore its node id as the kubelet resolves it, a service its name."""
    service = service_of(container)
    if service == "kvstore":
        return Identity.node(resolved_env(container)["SPECKV_NODE_ID"])
    return Identity.service(service)


def tls_volume(workload: dict, container: dict) -> tuple[dict, dict]:
    """(volume, volumeMount) of the one volume the container's three TLS files lie in."""
    env = literal_env(container)
    (folder,) = {str(Path(env[name]).parent) for name in TLS_VARIABLES}
    (mount,) = [m for m in container.get("volumeMounts", []) if m["mountPath"] == folder]
    (volume,) = [v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    return volume, mount


def csi_expand(value: str, variables: dict[str, str] = CSI_VARIABLES) -> str:
    """value with the csi-driver's ${VAR} / $VAR expanded; a variable it does not know fails."""
    def one(match: re.Match) -> str:
        name = match[1] or match[2]
        assert name in variables, f"{value}: the csi-driver expands no ${name}"
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, value)


def csi_list(attributes: dict[str, str], name: str, variables: dict[str, str] = CSI_VARIABLES) -> list[str]:
    return [csi_expand(v.strip(), variables) for v in attributes.get(CSI + name, "").split(",") if v.strip()]


def issue_like_csi_driver(attributes: dict[str, str], folder: Path, ca: tuple[ec.EllipticCurvePrivateKey,
                                                                             x509.Certificate]) -> None:
    """The files the csi-driver and a cert-manager CA Issuer would put in the
    volume: an RSA key as the driver makes it by default (PKCS#1 PEM), a
    certificate signed by the CA with the attributes' SANs and usages, and the
    CA's certificate, under the attributes' file names."""
    ca_key, ca_cert = ca
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in csi_list(attributes, "uri-sans")]
    names += [x509.DNSName(d) for d in csi_list(attributes, "dns-names")]
    names += [x509.IPAddress(ipaddress.ip_address(i)) for i in csi_list(attributes, "ip-sans")]
    usages = {u.strip() for u in attributes.get(CSI + "key-usages", CSI_DEFAULT_USAGES).split(",")}
    extended = {"server auth": ExtendedKeyUsageOID.SERVER_AUTH, "client auth": ExtendedKeyUsageOID.CLIENT_AUTH}
    assert usages <= {"digital signature", "key encipherment", *extended}, usages
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=30))
               .add_extension(x509.SubjectAlternativeName(names), critical=True)
               .add_extension(x509.KeyUsage(digital_signature="digital signature" in usages, content_commitment=False,
                                            key_encipherment="key encipherment" in usages, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=False, crl_sign=False,
                                            encipher_only=False, decipher_only=False), critical=True))
    if usages & set(extended):
        builder = builder.add_extension(x509.ExtendedKeyUsage([extended[u] for u in sorted(usages & set(extended))]),
                                        critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    files = {
        "certificate-file": cert.public_bytes(serialization.Encoding.PEM),
        "privatekey-file": key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                             serialization.NoEncryption()),
        "ca-file": ca_cert.public_bytes(serialization.Encoding.PEM),
    }
    defaults = dict(CSI_FILES.values())
    for attribute, data in files.items():
        (folder / attributes.get(CSI + attribute, defaults[attribute])).write_bytes(data)


@functools.cache
def cluster_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A CA like the one examples/issuer.yaml makes (what the speckv-ca Issuer signs with)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "speckv CA")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def port_named(container: dict, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port


def quantity(value: str | int) -> float:
    """A Kubernetes quantity (cpu cores or bytes) as a number."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match and match[2] in {"", *units}, f"quantity {value!r}"
    return float(match[1]) * units.get(match[2], 1)
