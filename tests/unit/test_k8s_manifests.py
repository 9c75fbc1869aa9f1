"""deploy/k8s: the Kustomize base and each overlay render (without a cluster)
into objects that validate against a pinned Kubernetes release's schemas,
run real `speckv` entry points configured only through variables their
config reads (and that validate as a config), probe the standard gRPC health
service on the gRPC port (plaintext roots) or the HTTP probes on the metrics
port (roots with the tls component), expose the metrics port to Prometheus,
carry requests and limits that hold the kvstore's pool, and are either
plaintext by explicit choice or mutual TLS throughout, each pod's certificate
naming the identity services/common/rpc/tls.py expects of its role.

Rendering: neither kustomize nor kubectl installs from Debian or PyPI, so
`render` below is a small Kustomize of its own for exactly the features
deploy/k8s uses (resources, components, namespace, a configMapGenerator with
its content hash, images, replicas, strategic-merge patches: the overlays'
of container resources only, the components' of what `_strategic_merge`
implements) and refuses anything else. Where kubectl is on PATH (CI's image has one), its
built-in kustomize renders every root too and the two must agree object for
object. Schemas: kubernetes-validate bundles them (pinned in the `test`
extra), so validation is offline.
"""
from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import functools
import hashlib
import importlib
import importlib.util
import ipaddress
import json
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from speckv.services import cli
from speckv.services.common.rpc import server as server_module
from speckv.services.common.config import config_from, env_name
from speckv.services.common.rpc.metrics_http import HEALTHZ_PATH, READYZ_PATH
from speckv.services.common.rpc.server import ServerSettings
from speckv.services.common.rpc.tls import Identity
from speckv.v1 import kvstore_pb2, predictor_pb2, scheduler_pb2
from tests.support.repo import REPO_ROOT

K8S = REPO_ROOT / "deploy" / "k8s"
ROOTS = {"base": K8S / "base", **{p.name: p for p in sorted((K8S / "overlays").iterdir()) if p.is_dir()}}
# The oldest Kubernetes the manifests claim (native gRPC probes are GA since
# 1.27; everything used is GA by 1.32, the kubectl release of CI's image) and
# the newest release the pinned kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.32.0", "1.37.0")
# The proto service each kind registers, which its probes must name.
HEALTH_SERVICES = {
    "kvstore": kvstore_pb2.DESCRIPTOR.services_by_name["KVStore"].full_name,
    "predictor": predictor_pb2.DESCRIPTOR.services_by_name["Predictor"].full_name,
    "scheduler": scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name,
}
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
PROCESS_MIB = 64  # a kvstore's memory beyond its pool: the figure and how it was read are in deploy/k8s/README.md
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
# What each probe asks over HTTP where the gRPC port is mutual TLS (metrics_http.py).
HTTP_PROBE_PATHS = {"startupProbe": READYZ_PATH, "readinessProbe": READYZ_PATH, "livenessProbe": HEALTHZ_PATH}


# --------------------------------------------------------------------------
# A small Kustomize: what deploy/k8s uses, nothing else.
# --------------------------------------------------------------------------
class Unsupported(Exception):
    """The kustomization uses something this renderer does not implement."""


NAMESPACED = {"ConfigMap", "Service", "Deployment", "StatefulSet", "DaemonSet"}
CLUSTER_SCOPED = {"Namespace"}
BASE_KEYS = {"apiVersion", "kind", "namespace", "resources", "configMapGenerator"}
# Overlays stay to images, replicas, resource patches and components (deploy/k8s/README.md).
OVERLAY_KEYS = {"apiVersion", "kind", "resources", "components", "images", "replicas", "patches"}
# A component (deploy/k8s/components/*) is patches of the pod templates only.
COMPONENT_KEYS = {"apiVersion", "kind", "patches"}
COMPONENT_API = "kustomize.config.k8s.io/v1alpha1"
# The list fields the patches merge, with the key Kubernetes' strategic merge
# matches their items by (patchMergeKey in the API types).
MERGE_KEYS = {"containers": "name", "env": "name", "volumes": "name", "volumeMounts": "mountPath"}


def render(root: Path) -> list[dict]:
    """The objects `kustomize build root` emits, in no particular order."""
    k = yaml.safe_load((root / "kustomization.yaml").read_text())
    if k.get("kind", "Kustomization") != "Kustomization":
        raise Unsupported(f"{root}: kind {k.get('kind')}")
    unknown = set(k) - (BASE_KEYS | OVERLAY_KEYS)
    if unknown:
        raise Unsupported(f"{root}: {sorted(unknown)}")
    objects: list[dict] = []
    for entry in k.get("resources", []):
        path = (root / entry).resolve()
        if path.is_dir():
            objects += render(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    # Kustomize applies components after the resources, before this root's own generators and transformers.
    for entry in k.get("components", []):
        objects = _apply_component((root / entry).resolve(), objects)
    renames = {}
    for generator in k.get("configMapGenerator", []):
        config_map = _generate_config_map(root, generator)
        renames[generator["name"]] = config_map["metadata"]["name"]
        objects.append(config_map)
    for patch_entry in k.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise Unsupported(f"{root}: patch {patch_entry} (only path: FILE)")
        for patch in yaml.safe_load_all((root / patch_entry["path"]).read_text()):
            _check_resource_patch(patch)
            target = _find(objects, patch["kind"], patch["metadata"]["name"])
            objects[objects.index(target)] = _strategic_merge(target, patch)
    for image in k.get("images", []):
        if not set(image) <= {"name", "newName", "newTag"}:
            raise Unsupported(f"{root}: image {image}")
        for container in _all_containers(objects):
            name, _, _tag = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image.get('newTag', _tag)}"
    for replicas in k.get("replicas", []):
        matches = [o for o in objects if o["metadata"]["name"] == replicas["name"] and o["kind"] in WORKLOAD_KINDS]
        if len(matches) != 1:
            raise Unsupported(f"{root}: replicas name {replicas['name']} matches {len(matches)} workloads")
        matches[0]["spec"]["replicas"] = replicas["count"]
    if "namespace" in k:
        for obj in objects:
            if obj["kind"] in NAMESPACED:
                obj["metadata"]["namespace"] = k["namespace"]
            elif obj["kind"] not in CLUSTER_SCOPED:
                raise Unsupported(f"{root}: is {obj['kind']} namespaced?")
            elif obj["kind"] == "Namespace" and obj["metadata"]["name"] != k["namespace"]:
                raise Unsupported(f"{root}: Namespace {obj['metadata']['name']} beside namespace {k['namespace']}")
    for spec in _pod_specs(objects):
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                volume["configMap"]["name"] = renames.get(volume["configMap"]["name"], volume["configMap"]["name"])
        for container in spec["containers"]:
            if container.get("envFrom") or any("configMapKeyRef" in e.get("valueFrom", {})
                                               for e in container.get("env", [])):
                raise Unsupported("ConfigMap references other than volumes")
    return objects


def _generate_config_map(root: Path, generator: dict) -> dict:
    if set(generator) != {"name", "files"}:
        raise Unsupported(f"configMapGenerator {sorted(generator)} (only name and files)")
    data = {}
    for entry in generator["files"]:
        if "=" in entry:
            raise Unsupported(f"configMapGenerator file {entry!r} (key=path)")
        path = (root / entry).resolve()
        if not path.is_relative_to(root.resolve()):  # kustomize's load restrictor
            raise Unsupported(f"{entry}: outside {root}")
        data[path.name] = path.read_text(encoding="utf-8")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{generator['name']}-{kustomize_hash(data)}"}, "data": data}


def kustomize_hash(data: dict[str, str]) -> str:
    """Kustomize's name suffix of a generated ConfigMap (api/hasher): the first
    10 hex digits of sha256 over Go's json.Marshal of {kind, name, data} (the
    name still empty then), with 0 1 3 a e spelled g h k m t."""
    encoded = json.dumps({"data": data, "kind": "ConfigMap", "name": ""}, sort_keys=True,
                         separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        encoded = encoded.replace(char, escaped)  # Go escapes these; Python does not
    return hashlib.sha256(encoded.encode()).hexdigest()[:10].translate(str.maketrans("013ae", "ghkmt"))


def _apply_component(root: Path, objects: list[dict]) -> list[dict]:
    """objects with the Component at root applied: its patches, merged into the workloads they name."""
    k = yaml.safe_load((root / "kustomization.yaml").read_text())
    if k.get("kind") != "Component" or k.get("apiVersion") != COMPONENT_API:
        raise Unsupported(f"{root}: {k.get('apiVersion')} {k.get('kind')} (a component is {COMPONENT_API} Component)")
    if set(k) - COMPONENT_KEYS:
        raise Unsupported(f"{root}: {sorted(set(k) - COMPONENT_KEYS)}")
    objects = list(objects)
    for patch_entry in k.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise Unsupported(f"{root}: patch {patch_entry} (only path: FILE)")
        for patch in yaml.safe_load_all((root / patch_entry["path"]).read_text()):
            if patch.get("kind") not in WORKLOAD_KINDS or set(patch) != {"apiVersion", "kind", "metadata", "spec"} \
                    or set(patch["metadata"]) != {"name"} or set(patch["spec"]) != {"template"}:
                raise Unsupported(f"{root}: patch of {patch.get('kind')}: only a workload's spec.template")
            target = _find(objects, patch["kind"], patch["metadata"]["name"])
            objects[objects.index(target)] = _strategic_merge(target, patch)
    return objects


def _check_resource_patch(patch: dict) -> None:
    """A patch may set container resources of one workload, nothing else."""
    containers = patch.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
    shape_ok = (patch.get("kind") in WORKLOAD_KINDS and set(patch) == {"apiVersion", "kind", "metadata", "spec"}
                and set(patch["metadata"]) == {"name"} and set(patch["spec"]) == {"template"}
                and set(patch["spec"]["template"]) == {"spec"} and set(patch["spec"]["template"]["spec"]) == {"containers"}
                and containers and all(set(c) == {"name", "resources"} for c in containers))
    if not shape_ok:
        raise Unsupported(f"patch of {patch.get('kind')}/{patch.get('metadata', {}).get('name')}: "
                          "only spec.template.spec.containers[].resources")


def _strategic_merge(target: dict, patch: dict) -> dict:
    """patch merged into a copy of target as kustomize's strategic merge does
    it, for what deploy/k8s uses: maps merge key by key and null deletes a
    key; the lists of MERGE_KEYS merge item by item on their key, an item
    `$patch: delete` drops its match, and the result lists the patch's items
    first, in its order, then the target's others in theirs (kustomize's
    order, which test_renderer_agrees_with_kubectl_kustomize holds us to).
    Any other list or `$patch` directive is Unsupported. A container the
    target lacks is Unsupported too: a patch adds none."""
    return _merge_map(copy.deepcopy(target), patch, target["metadata"]["name"])


def _merge_map(dest: dict, patch: dict, where: str) -> dict:
    for key, value in patch.items():
        here = f"{where}.{key}"
        if key.startswith("$"):
            raise Unsupported(f"{here}: directive {key}")
        if value is None:
            dest.pop(key, None)
        elif isinstance(value, dict):
            current = dest.get(key)
            dest[key] = _merge_map(current if isinstance(current, dict) else {}, value, here)
        elif isinstance(value, list):
            if key not in MERGE_KEYS:
                raise Unsupported(f"{here}: a list without a merge key (it would replace, not merge)")
            dest[key] = _merge_list(dest.get(key, []), value, MERGE_KEYS[key], here)
        else:
            dest[key] = value
    return dest


def _merge_list(dest: list[dict], patch: list[dict], key: str, where: str) -> list[dict]:
    existing = {item[key]: item for item in dest}
    merged, named = [], set()
    for item in patch:
        name = item[key]
        named.add(name)
        if item.get("$patch") == "delete":
            if set(item) != {key, "$patch"}:
                raise Unsupported(f"{where}[{name}]: $patch: delete beside other fields")
            continue
        if key == "name" and where.endswith(".containers") and name not in existing:
            raise Unsupported(f"{where}: patch names container {name} that the target lacks")
        merged.append(_merge_map(copy.deepcopy(existing.get(name, {})), item, f"{where}[{name}]"))
    return merged + [item for item in dest if item[key] not in named]


def _find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(matches) != 1:
        raise Unsupported(f"{kind}/{name}: {len(matches)} objects")
    return matches[0]


def _pod_specs(objects: list[dict]) -> list[dict]:
    return [o["spec"]["template"]["spec"] for o in objects if o["kind"] in WORKLOAD_KINDS]


def _all_containers(objects: list[dict]) -> list[dict]:
    return [c for spec in _pod_specs(objects) for c in [*spec.get("initContainers", []), *spec["containers"]]]


@functools.cache
def rendered(root: str) -> tuple[dict, ...]:
    return tuple(render(ROOTS[root]))


# --------------------------------------------------------------------------
# Helpers over rendered objects
# --------------------------------------------------------------------------
def workloads(root: str) -> list[dict]:
    return [o for o in rendered(root) if o["kind"] in WORKLOAD_KINDS]


def speckv_containers(root: str) -> list[tuple[dict, dict]]:
    """(workload, container) for every container running the speckv image."""
    return [(w, c) for w in workloads(root) for c in w["spec"]["template"]["spec"]["containers"]
            if c["image"].rpartition("/")[2].startswith("speckv:")]


def service_of(container: dict) -> str:
    return container["args"][0]


def config_class(service: str) -> type:
    module = importlib.import_module(f"speckv.services.{service}.config")
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


ROOT_NAMES = sorted(ROOTS)


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------
def test_there_are_overlays():
    assert "base" in ROOTS and len(ROOTS) >= 3, sorted(ROOTS)


def test_config_copies_equal_services_config():
    spec = importlib.util.spec_from_file_location("k8s_sync_config", K8S / "sync_config.py")
    sync_config = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync_config)
    assert sync_config.stale() == [], "run python deploy/k8s/sync_config.py"
    (generator,) = yaml.safe_load((ROOTS["base"] / "kustomization.yaml").read_text())["configMapGenerator"]
    listed = sorted(Path(f).name for f in generator["files"])
    assert listed == sorted(p.name for p in (REPO_ROOT / "services/config").glob("*.json")), \
        "list every services/config/*.json in the base's configMapGenerator"


def test_kustomize_hash_matches_a_known_kustomize_output():
    # `kubectl kustomize` (kustomize v5.5.0) named this ConfigMap cfg-5k6885gk7g.
    assert kustomize_hash({"x.json": "plain\n"}) == "5k6885gk7g"


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_renderer_agrees_with_kubectl_kustomize(root):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not on PATH: the renderer stands alone")
    out = subprocess.run([kubectl, "kustomize", str(ROOTS[root])], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    theirs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out.stdout) if o}
    ours = {(o["kind"], o["metadata"]["name"]): o for o in rendered(root)}
    assert sorted(ours) == sorted(theirs)
    for key in ours:
        assert ours[key] == theirs[key], key


def test_overlays_only_set_images_replicas_resources_and_components():
    for name, root in ROOTS.items():
        k = yaml.safe_load((root / "kustomization.yaml").read_text())
        allowed = BASE_KEYS if name == "base" else OVERLAY_KEYS
        assert set(k) <= allowed, f"{name}: {sorted(set(k) - allowed)}"
        if name != "base":
            assert k["resources"] == ["../../base"], name
            assert k.get("images") or k.get("replicas") or k.get("patches"), name
            for component in k.get("components", []):
                assert (root / component).resolve().parent == K8S / "components", f"{name}: {component}"
    # render() refuses overlay patches of anything but container resources.


def test_the_tls_component_renders_nothing_the_schema_cannot_check():
    """The component patches the workloads and adds no object: the Issuer and
    the admin Certificate are cert-manager CRDs, which the offline schemas do
    not know, so they stay samples beside it (examples/), outside every root."""
    component = K8S / "components" / "tls"
    k = yaml.safe_load((component / "kustomization.yaml").read_text())
    assert k["kind"] == "Component" and "resources" not in k
    listed = {p["path"] for p in k["patches"]}
    assert not any(path.startswith("examples") for path in listed)
    kinds = {d["kind"] for f in (component / "examples").glob("*.yaml") for d in yaml.safe_load_all(f.read_text()) if d}
    assert {"Issuer", "Certificate"} <= kinds
    assert {len(rendered(root)) for root in ROOT_NAMES} == {len(rendered("base"))}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("root", ROOT_NAMES)
def test_every_object_validates_against_the_schema(root, version):
    for obj in rendered(root):
        try:
            kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} against {version}: "
                        f"{'.'.join(map(str, e.path))}: {e.message}")


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_topology(root):
    by_service = {}
    for workload, container in speckv_containers(root):
        by_service.setdefault(service_of(container), []).append(workload)
    assert set(by_service) == set(cli.SERVICES)
    for service in ("scheduler", "predictor"):  # in-memory state, no sharing: one replica, never two at once
        (workload,) = by_service[service]
        assert workload["kind"] == "Deployment" and workload["spec"]["replicas"] == 1, service
        assert workload["spec"]["strategy"] == {"type": "Recreate"}, service
    (nodes,) = by_service["kvstore"]
    assert nodes["kind"] == "StatefulSet" and nodes["spec"]["replicas"] >= 2
    namespaces = {o["metadata"].get("namespace") for o in rendered(root) if o["kind"] != "Namespace"}
    assert namespaces == {"speckv"}


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_every_command_is_a_real_entry_point(root, capsys):
    for _, container in speckv_containers(root):
        assert "command" not in container, "keep the image's ENTRYPOINT (speckv)"
        assert service_of(container) in cli.SERVICES
    for service in {service_of(c) for _, c in speckv_containers(root)}:
        with pytest.raises(SystemExit) as exited:
            cli.main([service, "--help"], {})
        assert exited.value.code == 0
        assert "--port" in capsys.readouterr().out


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_every_speckv_variable_is_a_config_field(root):
    for workload, container in speckv_containers(root):
        variables = {e["name"] for e in container.get("env", []) if e["name"].startswith("SPECKV_")}
        unknown = variables - fields_of(service_of(container))
        assert not unknown, f"{workload['metadata']['name']}/{container['name']}: no config reads {sorted(unknown)}"


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_each_config_validates_from_the_manifest(root, tmp_path):
    """The environment as the kubelet sets it, with each ConfigMap volume's
    files where the container would see them, builds a valid config."""
    config_maps = {o["metadata"]["name"]: o["data"] for o in rendered(root) if o["kind"] == "ConfigMap"}
    for workload, container in speckv_containers(root):
        env = resolved_env(container)
        assert not any("$(" in v for v in env.values()), f"unresolved reference in {env}"
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            local = tmp_path / workload["metadata"]["name"] / mount["name"]
            local.mkdir(parents=True)
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                for key, text in config_maps[volume["configMap"]["name"]].items():
                    (local / key).write_text(text)
            elif "emptyDir" in volume:  # a writable folder the pod starts with empty (the scheduler's state)
                pass
            else:  # what cert-manager's csi-driver would mount: a certificate as the attributes ask
                assert volume["csi"]["driver"] == CSI_DRIVER, volume
                issue_like_csi_driver(volume["csi"]["volumeAttributes"], local, cluster_ca())
            for name, value in env.items():
                if name.startswith("SPECKV_") and value == mount["mountPath"]:
                    env[name] = str(local)  # a folder the service writes (SPECKV_STATE_DIR)
                elif name.startswith("SPECKV_") and value.startswith(mount["mountPath"] + "/"):
                    env[name] = str(local / value[len(mount["mountPath"]) + 1:])
                    assert Path(env[name]).is_file(), f"{name}={value}: not in the mounted volume"
        # validate() loads and checks the TLS files; a kvstore's also that they name its node id.
        config = config_from(config_class(service_of(container)), None, env)
        assert config.port == port_named(container, "grpc")
        assert config.host == "0.0.0.0", "probes and peers reach the pod IP"
        tls = config.tls()
        assert (tls is not None) == uses_tls(container)
        if tls is not None:
            server_module._check_identity(service_of(container), tls)  # what ServiceServer checks at start
            assert tls.identity == expected_identity(container)


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_probes_ask_grpc_health_or_the_http_probes(root):
    """Plaintext: native gRPC probes on the gRPC port, asking for the
    service's own name. Mutual TLS (the kubelet's gRPC probe speaks none):
    HTTP GET on the metrics port, /readyz (the health service's SERVING, so a
    drain takes the pod out of its Service) for startup and readiness,
    /healthz for liveness (a draining pod is not restarted)."""
    for workload, container in speckv_containers(root):
        where = f"{root}: {workload['metadata']['name']}"
        port = int(literal_env(container)["SPECKV_PORT"])
        assert port == port_named(container, "grpc")
        metrics_port = int(literal_env(container).get("SPECKV_METRICS_PORT", "0"))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            handler = {k: v for k, v in container[probe].items() if k in {"grpc", "exec", "httpGet", "tcpSocket"}}
            if not uses_tls(container):
                assert handler == {"grpc": {"port": port, "service": HEALTH_SERVICES[service_of(container)]}}, \
                    f"{where} {probe}"
                continue
            assert set(handler) == {"httpGet"}, f"{where} {probe}"
            get = handler["httpGet"]
            assert get["path"] == HTTP_PROBE_PATHS[probe] and get.get("scheme", "HTTP") == "HTTP", f"{where} {probe}"
            probed = port_named(container, get["port"]) if isinstance(get["port"], str) else get["port"]
            assert probed == metrics_port != 0, f"{where} {probe}: probes the metrics port, which is set"
        grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > config_class(service_of(container))().grace_s  # drains before the kill


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_metrics_port_is_scraped(root):
    for workload, container in speckv_containers(root):
        port = int(literal_env(container)["SPECKV_METRICS_PORT"])
        assert port == port_named(container, "metrics") and port != int(literal_env(container)["SPECKV_PORT"])
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                               "prometheus.io/path": "/metrics"}, workload["metadata"]["name"]


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_requests_and_limits(root):
    for workload, container in speckv_containers(root):
        where = f"{root}: {workload['metadata']['name']}/{container['name']}"
        resources = container["resources"]
        for resource in ("cpu", "memory"):
            request, limit = resources["requests"][resource], resources["limits"][resource]
            assert 0 < quantity(request) <= quantity(limit), f"{where} {resource}"
        if service_of(container) == "kvstore":
            env = resolved_env(container)
            if uses_tls(container):  # the pool does not depend on TLS; the certificate files are checked elsewhere
                env = {k: v for k, v in env.items() if k not in TLS_VARIABLES} | {"SPECKV_INSECURE": "true"}
            config = config_from(config_class("kvstore"), None, env)
            pool = (config.device_pages + config.host_pages) * config.kv_geometry().bytes_per_block
            floor = pool + PROCESS_MIB * 2**20
            assert quantity(resources["requests"]["memory"]) >= floor, f"{where}: requests hold the pool"


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_kvstore_identity_comes_from_the_downward_api(root):
    (workload, container), = [(w, c) for w, c in speckv_containers(root) if service_of(c) == "kvstore"]
    env = container["env"]
    names = [e["name"] for e in env]
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in env if "valueFrom" in e}
    node_id = literal_env(container)["SPECKV_NODE_ID"]
    advertise = literal_env(container)["SPECKV_ADVERTISE_ADDRESS"]
    (pod_name,) = re.fullmatch(r"\$\((\w+)\)", node_id).groups()
    pod_ip, port = re.fullmatch(r"\$\((\w+)\):(\d+)", advertise).groups()
    assert refs[pod_name] == "metadata.name" and refs[pod_ip] == "status.podIP"
    # The kubelet expands only variables defined earlier in the list.
    assert names.index(pod_name) < names.index("SPECKV_NODE_ID")
    assert names.index(pod_ip) < names.index("SPECKV_ADVERTISE_ADDRESS")
    assert int(port) == int(literal_env(container)["SPECKV_PORT"])
    assert int(literal_env(container)["SPECKV_DATA_PORT"]) == port_named(container, "data")


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_services_select_workloads_and_their_ports(root):
    services = {o["metadata"]["name"]: o for o in rendered(root) if o["kind"] == "Service"}
    for workload in workloads(root):
        template = workload["spec"]["template"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    for name, service in services.items():
        selected = [w for w in workloads(root)
                    if service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, f"Service {name} selects {len(selected)} workloads"
        ports = {p["name"]: p["containerPort"] for c in selected[0]["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert ports.get(port["targetPort"]) == port["port"], f"Service {name} port {port['name']}"
    for workload in workloads(root):
        if workload["kind"] == "StatefulSet":
            assert services[workload["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    # Addresses the services dial name a Service and one of its ports.
    for _, container in speckv_containers(root):
        for variable in ("SPECKV_SCHEDULER", "SPECKV_PREDICTOR"):
            if variable in literal_env(container):
                host, port = literal_env(container)[variable].rsplit(":", 1)
                assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}, variable


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_no_service_link_variables(root):
    """Kubernetes would put NAME_PORT, NAME_SERVICE_HOST, ... of every Service
    into each pod's environment, where a SPECKV_* one could set a config field
    (a Service named `speckv` would set SPECKV_PORT=tcp://...)."""
    for spec in _pod_specs(list(rendered(root))):
        assert spec["enableServiceLinks"] is False
    every_field = set().union(*(fields_of(s) for s in cli.SERVICES))
    for service in (o for o in rendered(root) if o["kind"] == "Service"):
        prefix = service["metadata"]["name"].upper().replace("-", "_")
        links = {f"{prefix}_SERVICE_HOST", f"{prefix}_SERVICE_PORT", f"{prefix}_PORT"}
        links |= {f"{prefix}_PORT_{p['port']}_TCP{suffix}" for p in service["spec"]["ports"]
                  for suffix in ("", "_PROTO", "_PORT", "_ADDR")}
        links |= {f"{prefix}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}" for p in service["spec"]["ports"]}
        assert not links & every_field, service["metadata"]["name"]


def test_production_is_mutual_tls_and_dev_plaintext():
    assert "components/tls" in " ".join(yaml.safe_load((ROOTS["production"] / "kustomization.yaml").read_text())
                                        .get("components", []))
    assert all(uses_tls(c) for _, c in speckv_containers("production"))
    assert not any(uses_tls(c) for root in ("base", "dev") for _, c in speckv_containers(root))


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_each_root_is_mutual_tls_throughout_or_plaintext_by_choice(root):
    """The services refuse a non-loopback host without TLS unless told
    --insecure, and a TLS server takes no plaintext client: so in a root
    either every pod has all three TLS files and no SPECKV_INSECURE, or every
    pod says SPECKV_INSECURE=true and has none (plaintext on the pod network
    a visible choice, never an accident)."""
    for name in TLS_VARIABLES:
        assert name in set().union(*(fields_of(s) for s in cli.SERVICES)), f"{name}: no config reads it"
    modes = set()
    for workload, container in speckv_containers(root):
        where = f"{root}: {workload['metadata']['name']}"
        env = literal_env(container)
        if uses_tls(container):
            assert all(env.get(name) for name in TLS_VARIABLES), f"{where}: all three TLS files, or none"
            assert "SPECKV_INSECURE" not in env, where
            modes.add("tls")
        else:
            assert env.get("SPECKV_INSECURE") == "true", where
            modes.add("plaintext")
    assert len(modes) == 1, f"{root}: some pods TLS, some plaintext; neither side can call the other"


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_each_pods_certificate_names_the_identity_tls_expects(root):
    """Every TLS file comes from one read-only csi.cert-manager.io volume
    whose attributes ask for the file names the variables point at, an
    Issuer, exactly one URI SAN, the identity tls.py expects of the role (a
    kvstore: its node id, which is its pod name, so each replica's differs),
    the DNS name clients verify (Identity.server_name), both TLS usages, and
    files readable by the group the container runs as."""
    containers = [(w, c) for w, c in speckv_containers(root) if uses_tls(c)]
    for workload, container in containers:
        where = f"{root}: {workload['metadata']['name']}"
        volume, mount = tls_volume(workload, container)
        assert mount.get("readOnly") is True and volume["csi"].get("readOnly") is True, where
        assert volume["csi"]["driver"] == CSI_DRIVER, where
        attributes = volume["csi"]["volumeAttributes"]
        unknown = sorted(set(attributes) - CSI_ATTRIBUTES)
        assert not unknown, f"{where}: the driver reads no {unknown}"
        env = literal_env(container)
        for name, (attribute, default) in CSI_FILES.items():
            assert env[name] == f"{mount['mountPath']}/{attributes.get(CSI + attribute, default)}", f"{where} {name}"
        assert attributes[CSI + "issuer-name"], where
        assert attributes.get(CSI + "issuer-kind", "Issuer") in {"Issuer", "ClusterIssuer"}, where
        expected = expected_identity(container)
        assert [Identity.parse(uri) for uri in csi_list(attributes, "uri-sans")] == [expected], where
        assert expected.server_name in csi_list(attributes, "dns-names"), \
            f"{where}: clients verify {expected.server_name}"
        usages = {u.strip() for u in attributes.get(CSI + "key-usages", CSI_DEFAULT_USAGES).split(",")}
        assert {"server auth", "client auth"} <= usages, where
        pod_security = workload["spec"]["template"]["spec"]["securityContext"]
        assert int(attributes[CSI + "fs-group"]) == pod_security["runAsGroup"], f"{where}: the key is mode 0440"
        if service_of(container) == "kvstore":
            pods = [f"{workload['metadata']['name']}-{i}" for i in range(workload["spec"]["replicas"])]
            uris = {pod: csi_list(attributes, "uri-sans", {**CSI_VARIABLES, "POD_NAME": pod}) for pod in pods}
            assert uris == {pod: [Identity.node(pod).uri] for pod in pods}, where
            assert FIELD_REFS["metadata.name"] == CSI_VARIABLES["POD_NAME"]  # expected_identity's node id: the pod name
    assert bool(containers) == (root == "production")