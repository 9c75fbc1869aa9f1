"""The service install is lean: a service process never imports the lab's
dependencies (pyproject's `lab` extra, and Ray's), and the lab commands
without them exit with one line naming the extra.

Each check runs in a fresh interpreter, since this test process has imported
everything. The service entry modules are imported and a service command's
flags parsed (`--help`) through the `speckv` entry point, as a container does.
"""
from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from speckv.services import cli
from tests.support.repo import REPO_ROOT

LAB_ONLY = ("torch", "matplotlib", "statsmodels", "ray")
SERVICE_MODULES = (
    *cli.SERVER_MODULES.values(),
    "speckv.services.cluster.up",
    "speckv.services.cluster.status",
    "speckv.services.cluster.node_cli",
    "speckv.services.cluster.health",
    "speckv.services.cluster.certs",
)
SERVICE_COMMANDS = ("kvstore", "predictor", "scheduler", "up", "status", "node", "health", "certs")

PROBE = """
import contextlib, importlib, io, sys
from speckv.services import cli
for name in {modules!r}:
    importlib.import_module(name)
for command in {commands!r}:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main([command, "--help"], {{}})
        except SystemExit as exited:
            code = exited.code
    assert code == 0, (command, code)
print(",".join(sorted(n for n in {lab!r} if n in sys.modules)))
"""


def _python(source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=120)


def test_service_processes_import_none_of_the_lab():
    done = _python(PROBE.format(modules=SERVICE_MODULES, commands=SERVICE_COMMANDS, lab=LAB_ONLY))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"a service process imported {done.stdout.strip()}"


@pytest.mark.parametrize("command", cli.LAB)
def test_a_lab_command_without_the_extra_says_so_in_one_line(command):
    # sys.modules[name] = None: this interpreter finds no such package.
    hide = "".join(f"sys.modules[{name!r}] = None\n" for name in cli.LAB_DEPS)
    done = _python(f"import sys\n{hide}from speckv.services import cli\nsys.exit(cli.main([{command!r}, '--help'], {{}}))")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"speckv {command}: needs the lab extra ({', '.join(cli.LAB_DEPS)} not installed): pip install 'speckv[lab]'"]


def test_the_cli_names_the_lab_extra_of_pyproject():
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    lab = {req.split("==")[0] for req in extras["lab"]}
    assert lab == set(cli.LAB_DEPS)
    core = {req.split("==")[0] for req in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert core.isdisjoint({*lab, "ray"})
