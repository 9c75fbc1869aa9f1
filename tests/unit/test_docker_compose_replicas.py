"""docker-compose.replicas.yml laid over docker-compose.yml (`docker compose
-f docker-compose.yml -f docker-compose.replicas.yml up`): etcd and a second
scheduler, both schedulers replicas on that etcd that find each other and are
found by the kvstores through one DNS alias, each configured through
variables its config reads and building a valid config with the certs
container's bundle.

Merging: a small merge of compose's own rules for what the file uses
(environment and depends_on merge by key, anything else replaces); where
docker-compose is on PATH its `config` must agree on every speckv service's
SPECKV_* variables, networks and dependencies."""
from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from speckv.services import cli
from speckv.services.cluster.etcd_process import etcd_command
from speckv.services.common.config import config_from, env_name
from speckv.services.common.discovery import parse_targets
from speckv.services.scheduler.leadership.adapters.etcd_keys import parse_endpoint
from tests.support.repo import REPO_ROOT
from tests.unit.test_docker_compose import config_class

BASE = REPO_ROOT / "docker-compose.yml"
OVERRIDE = REPO_ROOT / "docker-compose.replicas.yml"
MERGED_BY_KEY = ("environment", "depends_on")


def merge(base: dict, override: dict) -> dict:
    merged = copy.deepcopy(base)
    for name, service in override["services"].items():
        target = merged["services"].setdefault(name, {})
        for key, value in service.items():
            if key in MERGED_BY_KEY and key in target:
                target[key] = {**target[key], **value}
            else:
                target[key] = copy.deepcopy(value)
    merged["volumes"] = {**merged.get("volumes", {}), **override.get("volumes", {})}
    return merged


COMPOSE = merge(yaml.safe_load(BASE.read_text()), yaml.safe_load(OVERRIDE.read_text()))
SERVICES = {name: s for name, s in COMPOSE["services"].items()
            if s.get("image", "").startswith("speckv:") and s["command"][0] in cli.SERVICES}
SCHEDULERS = {name: s for name, s in SERVICES.items() if s["command"][0] == "scheduler"}
NODES = {name: s for name, s in SERVICES.items() if s["command"][0] == "kvstore"}


def aliases(service: dict) -> set[str]:
    networks = service.get("networks", {})
    return {a for n in (networks.values() if isinstance(networks, dict) else []) for a in (n or {}).get("aliases", [])}


def test_docker_compose_merges_the_files_alike():
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose not on PATH: the merge stands alone")
    out = subprocess.run([compose, "-f", str(BASE), "-f", str(OVERRIDE), "config"], capture_output=True, text=True,
                         timeout=120, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    theirs = yaml.safe_load(out.stdout)["services"]
    assert sorted(theirs) == sorted(COMPOSE["services"])
    for name, ours in SERVICES.items():
        env = {k: v for k, v in theirs[name]["environment"].items() if k.startswith("SPECKV_")}
        assert env == {k: v for k, v in ours["environment"].items() if k.startswith("SPECKV_")}, name
        assert set(theirs[name].get("depends_on", {})) == set(ours.get("depends_on", {})), name
        assert aliases(theirs[name]) == aliases(ours), name


def test_two_scheduler_replicas_on_etcd_found_through_one_alias():
    assert len(SCHEDULERS) >= 2
    alias_sets = [parse_targets(s["environment"]["SPECKV_PEERS"], "peers") for s in SCHEDULERS.values()]
    (peers,) = {targets for targets in alias_sets}
    (name,) = peers.names
    assert not peers.static
    # The alias resolves to every scheduler and to nothing else.
    assert sorted(n for n, s in COMPOSE["services"].items() if name.name in aliases(s)) == sorted(SCHEDULERS)
    for service_name, service in SCHEDULERS.items():
        env = service["environment"]
        assert name.port == int(env["SPECKV_PORT"])
        assert env["SPECKV_ADVERTISE_ADDRESS"] == f"{service_name}:{env['SPECKV_PORT']}"  # itself, left out of peers
        assert env["SPECKV_REPLICA_ID"] == service_name
        assert not env.get("SPECKV_STATE_DIR"), "the state lives in etcd"
        assert service["depends_on"]["etcd"] == {"condition": "service_healthy"}
    for node in NODES.values():
        assert parse_targets(node["environment"]["SPECKV_SCHEDULER"], "scheduler") == peers


def test_etcd_is_one_pinned_member_with_speckv_etcds_compaction():
    etcd = COMPOSE["services"]["etcd"]
    image, _, tag = etcd["image"].rpartition(":")
    assert image.endswith("/etcd") and tag.startswith("v3.") and tag != "latest"
    command = etcd["command"]
    ours = etcd_command("etcd", "n", Path("/d"), "h", 1, 2)
    for flag in ("--auto-compaction-mode", "--auto-compaction-retention"):
        assert f"{flag}={ours[ours.index(flag) + 1]}" in command, flag
    client = next(a.split("=", 1)[1] for a in command if a.startswith("--listen-client-urls="))
    for service in SCHEDULERS.values():
        host, port = parse_endpoint(service["environment"]["SPECKV_ETCD"])
        assert host == "etcd" and port == parse_endpoint(client)[1]
    data_dir = next(a.split("=", 1)[1] for a in command if a.startswith("--data-dir="))
    (volume,) = etcd["volumes"]
    named, path = volume.split(":")[:2]
    assert data_dir.startswith(path) and named in COMPOSE["volumes"], "etcd's data outlives the container"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_each_service_builds_a_valid_config_with_the_certs(name, tmp_path):
    env = SERVICES[name]["environment"]
    fields = {env_name(f) for f in config_class(SERVICES[name]["command"][0]).__dataclass_fields__}
    assert {k for k in env if k.startswith("SPECKV_")} <= fields, name
    assert env["SPECKV_HOST"] == "0.0.0.0" and "SPECKV_INSECURE" not in env
    argv = COMPOSE["services"]["certs"]["command"]
    assert cli.main([*argv[:argv.index("--out") + 1], str(tmp_path), *argv[argv.index("--out") + 2:]], {}) == 0
    local = {k: v.replace("/certs", str(tmp_path), 1) if k.startswith("SPECKV_TLS_") else v for k, v in env.items()}
    config = config_from(config_class(SERVICES[name]["command"][0]), None, local)
    assert config.tls() is not None
    test = SERVICES[name]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "speckv", "health"] and test[-1].endswith(f":{env['SPECKV_PORT']}")
