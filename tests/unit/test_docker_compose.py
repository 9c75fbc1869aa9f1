"""docker-compose.yml runs real `speckv` entry points configured through
variables that each service's config actually reads (no Docker engine needed:
CI also runs `docker-compose config -q`)."""
from __future__ import annotations

import dataclasses
import importlib

import pytest
import yaml

from speckv.services import cli
from speckv.services.common.config import config_from, env_name
from speckv.services.common.rpc.server import ServerSettings
from tests.support.repo import REPO_ROOT

COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
# The speckv services; the `monitoring` profile's Prometheus and Grafana run
# images of their own (tests/unit/test_monitoring_config.py checks them), and
# the one-shot `certs` container runs a tool, not a service.
SPECKV = {name: s for name, s in COMPOSE["services"].items() if s.get("image", "").startswith("speckv:")}
SERVICES = {name: s for name, s in SPECKV.items() if s["command"][0] in cli.SERVICES}
TOOLS = {name: s for name, s in SPECKV.items() if name not in SERVICES}


def config_class(service: str) -> type:
    module = importlib.import_module(cli.SERVER_MODULES[service].rsplit(".", 1)[0] + ".config")
    classes = [c for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, ServerSettings) and c is not ServerSettings]
    assert len(classes) == 1, f"{module.__name__} must define one config class"
    return classes[0]


def test_topology_has_every_service():
    commands = sorted(s["command"][0] for s in SERVICES.values())
    assert set(commands) == set(cli.SERVICES)
    assert commands.count("kvstore") >= 2


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_command_is_a_real_entry_point(name, capsys):
    command = SERVICES[name]["command"]
    assert command[0] in cli.SERVICES
    with pytest.raises(SystemExit) as exited:
        cli.main([command[0], "--help"], {})
    assert exited.value.code == 0
    assert "--port" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_speckv_variable_is_a_config_field(name):
    fields = {env_name(f.name) for f in dataclasses.fields(config_class(SERVICES[name]["command"][0]))}
    variables = {k for k in SERVICES[name]["environment"] if k.startswith("SPECKV_")}
    assert variables <= fields, f"{name}: variables no config reads: {sorted(variables - fields)}"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_healthcheck_speaks_grpc_health(name):
    test = SERVICES[name]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "speckv", "health"]
    port = SERVICES[name]["environment"]["SPECKV_PORT"]
    assert test[test.index("--address") + 1].endswith(f":{port}")


def test_only_the_certs_tool_runs_beside_the_services():
    assert sorted(TOOLS) == ["certs"]
    assert TOOLS["certs"]["command"][0] in cli.TOOLS


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_binds_beyond_loopback_only_with_tls(name, tmp_path):
    """Each service's environment names its own certificate from the certs
    container's bundle, and builds a valid config from that bundle (made here
    with the container's own command line)."""
    env = SERVICES[name]["environment"]
    assert env["SPECKV_HOST"] == "0.0.0.0" and "SPECKV_INSECURE" not in env
    assert SERVICES[name]["depends_on"]["certs"] == {"condition": "service_completed_successfully"}
    argv = TOOLS["certs"]["command"]
    assert cli.main([*argv[:argv.index("--out") + 1], str(tmp_path), *argv[argv.index("--out") + 2:]], {}) == 0
    local = {k: v.replace("/certs", str(tmp_path), 1) if k.startswith("SPECKV_TLS_") else v for k, v in env.items()}
    config = config_from(config_class(SERVICES[name]["command"][0]), None, local)
    assert config.tls() is not None
