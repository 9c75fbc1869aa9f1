"""deploy/k8s: the Kustomize base and each overlay render (without a cluster)
into objects that validate against a pinned Kubernetes release's schemas,
run real `speckv` entry points configured only through variables their
config reads (and that validate as a config), probe the standard gRPC health
service on the gRPC port (plaintext roots) or the HTTP probes on the metrics
port (roots with the tls component), expose the metrics port to Prometheus
and carry requests and limits that hold the kvstore's pool. Mutual TLS:
test_k8s_tls.py.

Rendering: tests.support.kustomize, a small Kustomize of its own (neither
kustomize nor kubectl installs from Debian or PyPI); where kubectl is on PATH
(CI's image has one), its built-in kustomize renders every root too and the
two must agree object for object. Schemas: kubernetes-validate bundles them
(pinned in the `test` extra), so validation is offline.
"""
from __future__ import annotations

import copy
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from speckv.services import cli
from speckv.services.cluster.etcd_process import etcd_command
from speckv.services.common.discovery import parse_targets
from speckv.services.common.config import config_from
from speckv.services.common.rpc import server as server_module
from speckv.services.common.rpc.metrics_http import HEALTHZ_PATH, READYZ_PATH
from speckv.services.scheduler.leadership.adapters.etcd_keys import parse_endpoint
from speckv.v1 import kvstore_pb2, predictor_pb2, scheduler_pb2
from tests.support.k8s_objects import (
    CSI_DRIVER,
    TLS_VARIABLES,
    cluster_ca,
    config_class,
    expected_identity,
    fields_of,
    issue_like_csi_driver,
    literal_env,
    port_named,
    quantity,
    resolved_env,
    service_of,
    speckv_containers,
    uses_tls,
    workloads,
)
from tests.support.kustomize import (
    BASE_KEYS,
    K8S,
    OVERLAY_KEYS,
    ROOT_NAMES,
    ROOTS,
    kustomize_hash,
    pod_specs,
    render,
    rendered,
)
from tests.support.repo import REPO_ROOT

# The roots with components/replicas: the scheduler as replicas on etcd.
REPLICA_ROOTS = [name for name in ROOT_NAMES
                 if "components/replicas" in " ".join(yaml.safe_load((ROOTS[name] / "kustomization.yaml").read_text())
                                                      .get("components", []))]

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
PROCESS_MIB = 64  # a kvstore's memory beyond its pool: the figure and how it was read are in deploy/k8s/README.md
# What each probe asks over HTTP where the gRPC port is mutual TLS (metrics_http.py).
HTTP_PROBE_PATHS = {"startupProbe": READYZ_PATH, "readinessProbe": READYZ_PATH, "livenessProbe": HEALTHZ_PATH}


def test_there_are_overlays():
    assert "base" in ROOTS and len(ROOTS) >= 3, sorted(ROOTS)
    assert REPLICA_ROOTS == ["replicas"]


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
    plain = [root for root in ROOT_NAMES if root not in REPLICA_ROOTS]
    assert {len(rendered(root)) for root in plain} == {len(rendered("base"))}


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
    # In-memory state, no sharing: one replica, never two at once; the scheduler's replicas: test_scheduler_replicas_*.
    for service in ("predictor",) if root in REPLICA_ROOTS else ("scheduler", "predictor"):
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
    # Addresses the services dial name a Service and one of its ports; a dns: entry a headless one (its name
    # resolves to every pod's IP) of the scheduler's pods.
    scheduler_labels = next(w for w, c in speckv_containers(root) if service_of(c) == "scheduler")[
        "spec"]["template"]["metadata"]["labels"]
    for _, container in speckv_containers(root):
        for variable in ("SPECKV_SCHEDULER", "SPECKV_PREDICTOR", "SPECKV_PEERS"):
            targets = parse_targets(literal_env(container).get(variable, ""), variable)
            for host, port in [address.rsplit(":", 1) for address in targets.static] + \
                    [(name.name, name.port) for name in targets.names]:
                assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}, variable
            for name in targets.names:
                service = services[name.name]["spec"]
                assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True, variable
                assert service["selector"].items() <= scheduler_labels.items(), variable
        if "SPECKV_ETCD" in literal_env(container):
            host, port = parse_endpoint(literal_env(container)["SPECKV_ETCD"])
            assert port in {p["port"] for p in services[host]["spec"]["ports"]}, "SPECKV_ETCD"


@pytest.mark.parametrize("root", REPLICA_ROOTS)
def test_scheduler_replicas_on_etcd_find_each_other_through_dns(root):
    """components/replicas: the scheduler as a Deployment of several
    replicas rolled one at a time, each elected on the etcd the component
    runs (no SQLite state beside it: the config refuses both), named by its
    pod, advertising its pod IP; peers and kvstores name every replica
    through one dns: entry (checked against the Services above)."""
    (workload, container), = [(w, c) for w, c in speckv_containers(root) if service_of(c) == "scheduler"]
    assert workload["kind"] == "Deployment" and workload["spec"]["replicas"] >= 2
    assert workload["spec"]["strategy"]["type"] == "RollingUpdate"
    assert workload["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0  # Route never loses a replica
    env = literal_env(container)
    assert "SPECKV_STATE_DIR" not in env
    assert "/state" not in {m["mountPath"] for m in container.get("volumeMounts", [])}
    assert "state" not in {v["name"] for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    names = [e["name"] for e in container["env"]]
    (pod_name,) = re.fullmatch(r"\$\((\w+)\)", env["SPECKV_REPLICA_ID"]).groups()
    pod_ip, port = re.fullmatch(r"\$\((\w+)\):(\d+)", env["SPECKV_ADVERTISE_ADDRESS"]).groups()
    assert refs[pod_name] == "metadata.name" and refs[pod_ip] == "status.podIP"
    assert names.index(pod_name) < names.index("SPECKV_REPLICA_ID")  # the kubelet expands earlier ones only
    assert names.index(pod_ip) < names.index("SPECKV_ADVERTISE_ADDRESS")
    assert int(port) == int(env["SPECKV_PORT"])
    peers = parse_targets(env["SPECKV_PEERS"], "peers")
    assert peers.names and not peers.static
    (kvstore,) = [c for _, c in speckv_containers(root) if service_of(c) == "kvstore"]
    assert parse_targets(literal_env(kvstore)["SPECKV_SCHEDULER"]) == peers  # every replica, as the peers

    (etcd_set,) = [w for w in workloads(root) if w["metadata"]["name"] == "speckv-etcd"]
    assert etcd_set["kind"] == "StatefulSet" and etcd_set["spec"]["replicas"] == 1  # one member: its flags name one
    (etcd,) = etcd_set["spec"]["template"]["spec"]["containers"]
    image, _, tag = etcd["image"].rpartition(":")
    assert image.endswith("/etcd") and re.fullmatch(r"v3\.\d+\.\d+", tag), "a pinned etcd release"
    args = etcd["args"]
    # The auto-compaction `speckv etcd` runs with (every order transition is a revision).
    ours = etcd_command("etcd", "n", Path("/d"), "h", 1, 2)
    for flag in ("--auto-compaction-mode", "--auto-compaction-retention"):
        assert f"{flag}={ours[ours.index(flag) + 1]}" in args, flag
    data_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--data-dir="))
    mounts = {m["name"]: m["mountPath"] for m in etcd["volumeMounts"]}
    claims = {c["metadata"]["name"] for c in etcd_set["spec"].get("volumeClaimTemplates", [])}
    volumes = {v["name"] for v in etcd_set["spec"]["template"]["spec"].get("volumes", [])}
    assert any(data_dir.startswith(path) and name in claims | volumes for name, path in mounts.items())
    client = next(a.split("=", 1)[1] for a in args if a.startswith("--listen-client-urls="))
    assert parse_endpoint(client)[1] == port_named(etcd, "client")
    assert parse_endpoint(literal_env(container)["SPECKV_ETCD"])[1] == port_named(etcd, "client")


@pytest.mark.parametrize("root", ROOT_NAMES)
def test_no_service_link_variables(root):
    """Kubernetes would put NAME_PORT, NAME_SERVICE_HOST, ... of every Service
    into each pod's environment, where a SPECKV_* one could set a config field
    (a Service named `speckv` would set SPECKV_PORT=tcp://...)."""
    for spec in pod_specs(list(rendered(root))):
        assert spec["enableServiceLinks"] is False
    every_field = set().union(*(fields_of(s) for s in cli.SERVICES))
    for service in (o for o in rendered(root) if o["kind"] == "Service"):
        prefix = service["metadata"]["name"].upper().replace("-", "_")
        links = {f"{prefix}_SERVICE_HOST", f"{prefix}_SERVICE_PORT", f"{prefix}_PORT"}
        links |= {f"{prefix}_PORT_{p['port']}_TCP{suffix}" for p in service["spec"]["ports"]
                  for suffix in ("", "_PROTO", "_PORT", "_ADDR")}
        links |= {f"{prefix}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}" for p in service["spec"]["ports"]}
        assert not links & every_field, service["metadata"]["name"]
