"""deploy/k8s: the Kustomize base and each overlay render (without a cluster)
into objects that validate against a pinned Kubernetes release's schemas,
run real `speckv` entry points configured only through variables their
config reads (and that validate as a config), probe the standard gRPC health
service on the gRPC port, expose the metrics port to Prometheus, and carry
requests and limits that hold the kvstore's pool.

Rendering: neither kustomize nor kubectl installs from Debian or PyPI, so
`render` below is a small Kustomize of its own for exactly the features
deploy/k8s uses (resources, namespace, a configMapGenerator with its content
hash, images, replicas, strategic-merge patches of container resources) and
refuses anything else. Where kubectl is on PATH (CI's image has one), its
built-in kustomize renders every root too and the two must agree object for
object. Schemas: kubernetes-validate bundles them (pinned in the `test`
extra), so validation is offline.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from speckv.services import cli
from speckv.services.common.config import config_from, env_name
from speckv.services.common.server import ServerSettings
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


# --------------------------------------------------------------------------
# A small Kustomize: what deploy/k8s uses, nothing else.
# --------------------------------------------------------------------------
class Unsupported(Exception):
    """The kustomization uses something this renderer does not implement."""


NAMESPACED = {"ConfigMap", "Service", "Deployment", "StatefulSet", "DaemonSet"}
CLUSTER_SCOPED = {"Namespace"}
BASE_KEYS = {"apiVersion", "kind", "namespace", "resources", "configMapGenerator"}
# Overlays stay to images, replicas and resource patches (deploy/k8s/README.md).
OVERLAY_KEYS = {"apiVersion", "kind", "resources", "images", "replicas", "patches"}


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
    out = copy.deepcopy(target)
    by_name = {c["name"]: c for c in out["spec"]["template"]["spec"]["containers"]}
    for container in patch["spec"]["template"]["spec"]["containers"]:
        if container["name"] not in by_name:
            raise Unsupported(f"patch names container {container['name']} that {target['metadata']['name']} lacks")
        resources = by_name[container["name"]].setdefault("resources", {})
        for section, values in container["resources"].items():
            merged = {**resources.get(section, {}), **values}
            resources[section] = {k: v for k, v in merged.items() if v is not None}  # null deletes
    return out


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


def test_overlays_only_set_images_replicas_and_resources():
    for name, root in ROOTS.items():
        k = yaml.safe_load((root / "kustomization.yaml").read_text())
        allowed = BASE_KEYS if name == "base" else OVERLAY_KEYS
        assert set(k) <= allowed, f"{name}: {sorted(set(k) - allowed)}"
        if name != "base":
            assert k["resources"] == ["../../base"], name
            assert k.get("images") or k.get("replicas") or k.get("patches"), name
    # render() refuses patches of anything but container resources.


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
            for key, text in config_maps[volumes[mount["name"]]["configMap"]["name"]].items():
                (local / key).write_text(text)
            for name, value in env.items():
                if name.startswith("SPECKV_") and value.startswith(mount["mountPath"] + "/"):
                    env[name] = str(local / value[len(mount["mountPath"]) + 1:])
                    assert Path(env[name]).is_file(), f"{name}={value}: not in the mounted ConfigMap"
        config = config_from(config_class(service_of(container)), None, env)
        assert config.port == port_named(container, "grpc")
        assert config.host == "0.0.0.0", "probes and peers reach the pod IP"


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_probes_ask_grpc_health_on_the_grpc_port(root):
    for workload, container in speckv_containers(root):
        port = int(literal_env(container)["SPECKV_PORT"])
        assert port == port_named(container, "grpc")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            handler = {k: v for k, v in container[probe].items() if k in {"grpc", "exec", "httpGet", "tcpSocket"}}
            assert handler == {"grpc": {"port": port, "service": HEALTH_SERVICES[service_of(container)]}}, \
                f"{workload['metadata']['name']} {probe}"
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


def test_plaintext_is_chosen_explicitly_while_there_is_no_tls_overlay():
    """The services take TLS settings (docs/security.md) and refuse a
    non-loopback host without them unless told --insecure; until an overlay
    wires certificates (a TLS overlay: its name holds "tls"), every pod must
    say SPECKV_INSECURE=true, so plaintext on the pod network is a visible
    choice, never an accident."""
    tls_fields = sorted(f for s in cli.SERVICES for f in fields_of(s)
                        if re.search(r"TLS|CERT|_KEY\b|_CA\b", f))
    assert tls_fields, "the services take TLS settings"
    tls_overlays = sorted(p.name for p in (K8S / "overlays").iterdir() if "tls" in p.name)
    if tls_overlays:
        return
    for root in ROOT_NAMES:
        for workload, container in speckv_containers(root):
            assert literal_env(container).get("SPECKV_INSECURE") == "true", (root, workload["metadata"]["name"])