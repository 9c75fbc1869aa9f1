"""A small Kustomize of its own for exactly the features deploy/k8s uses
(resources, components, namespace, a configMapGenerator with its content
hash, images, replicas, strategic-merge patches: the overlays' of container
resources only, the components' of what `_strategic_merge` implements, and
components' own resources); it refuses anything else. Neither kustomize nor kubectl installs from Debian or
PyPI, so the manifest tests (tests/unit/test_k8s_manifests.py,
test_k8s_tls.py) render with this; where kubectl is on PATH, its built-in
kustomize must agree object for object.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
from pathlib import Path

import yaml

from tests.support.repo import REPO_ROOT

K8S = REPO_ROOT / "deploy" / "k8s"
ROOTS = {"base": K8S / "base", **{p.name: p for p in sorted((K8S / "overlays").iterdir()) if p.is_dir()}}
ROOT_NAMES = sorted(ROOTS)
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")


class Unsupported(Exception):
    """The kustomization uses something this renderer does not implement."""


NAMESPACED = {"ConfigMap", "Service", "Deployment", "StatefulSet", "DaemonSet"}
CLUSTER_SCOPED = {"Namespace"}
BASE_KEYS = {"apiVersion", "kind", "namespace", "resources", "configMapGenerator"}
# Overlays stay to images, replicas, resource patches and components (deploy/k8s/README.md).
OVERLAY_KEYS = {"apiVersion", "kind", "resources", "components", "images", "replicas", "patches"}
# A component (deploy/k8s/components/*) is resources of its own and patches of
# the workloads' pod templates and rollout strategy.
COMPONENT_KEYS = {"apiVersion", "kind", "resources", "patches"}
COMPONENT_PATCH_SPEC = {"template", "strategy"}
COMPONENT_API = "kustomize.config.k8s.io/v1alpha1"
# The list fields the patches merge, with the key Kubernetes' strategic merge
# matches their items by (patchMergeKey in the API types).
MERGE_KEYS = {"containers": "name", "env": "name", "volumes": "name", "volumeMounts": "mountPath"}
# The maps whose patchStrategy is retainKeys (a Deployment's strategy: a Recreate has no rollingUpdate).
RETAIN_KEYS = {"strategy"}


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
        for container in all_containers(objects):
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
    for spec in pod_specs(objects):
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
    """objects with the Component at root applied: its resources added, then its patches merged into the
    workloads they name (kustomize's order: a component's transformers see its own resources too)."""
    k = yaml.safe_load((root / "kustomization.yaml").read_text())
    if k.get("kind") != "Component" or k.get("apiVersion") != COMPONENT_API:
        raise Unsupported(f"{root}: {k.get('apiVersion')} {k.get('kind')} (a component is {COMPONENT_API} Component)")
    if set(k) - COMPONENT_KEYS:
        raise Unsupported(f"{root}: {sorted(set(k) - COMPONENT_KEYS)}")
    objects = list(objects)
    for entry in k.get("resources", []):
        path = (root / entry).resolve()
        if path.is_dir() or not path.is_relative_to(root):
            raise Unsupported(f"{root}: component resource {entry} (only files of its own)")
        objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for patch_entry in k.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise Unsupported(f"{root}: patch {patch_entry} (only path: FILE)")
        for patch in yaml.safe_load_all((root / patch_entry["path"]).read_text()):
            if patch.get("kind") not in WORKLOAD_KINDS or set(patch) != {"apiVersion", "kind", "metadata", "spec"} \
                    or set(patch["metadata"]) != {"name"} or not set(patch["spec"]) <= COMPONENT_PATCH_SPEC:
                raise Unsupported(f"{root}: patch of {patch.get('kind')}: only a workload's spec.template "
                                  "and spec.strategy")
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
            if key in RETAIN_KEYS:  # patchStrategy retainKeys: the target's keys the patch leaves out go
                dest[key] = {k: v for k, v in dest[key].items() if k in value}
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


def pod_specs(objects: list[dict]) -> list[dict]:
    return [o["spec"]["template"]["spec"] for o in objects if o["kind"] in WORKLOAD_KINDS]


def all_containers(objects: list[dict]) -> list[dict]:
    return [c for spec in pod_specs(objects) for c in [*spec.get("initContainers", []), *spec["containers"]]]


@functools.cache
def rendered(root: str) -> tuple[dict, ...]:
    return tuple(render(ROOTS[root]))
