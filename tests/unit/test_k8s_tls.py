"""deploy/k8s and mutual TLS: each root is plaintext by explicit choice or
mutual TLS throughout, production TLS and dev plaintext, and each pod's
certificate (cert-manager's csi-driver volume) names the identity
services/common/rpc/tls.py expects of its role. Rendering as in
test_k8s_manifests.py (tests.support.kustomize).
"""
from __future__ import annotations

import pytest
import yaml

from speckv.services import cli
from speckv.services.common.rpc.tls import Identity
from tests.support.k8s_objects import (
    CSI,
    CSI_ATTRIBUTES,
    CSI_DEFAULT_USAGES,
    CSI_DRIVER,
    CSI_FILES,
    CSI_VARIABLES,
    FIELD_REFS,
    TLS_VARIABLES,
    csi_list,
    expected_identity,
    fields_of,
    literal_env,
    service_of,
    speckv_containers,
    tls_volume,
    uses_tls,
)
from tests.support.kustomize import ROOT_NAMES, ROOTS


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
