"""`speckv scheduler --compiled`: a process that should run on the
mypyc-compiled build re-starts itself (same pid) with the build first on its
path, refuses to start under `on` without a current build, and never
re-starts twice (services/scheduler/adapters/compiled_start.py)."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speckv.loadgen.sim.compiled import copy_package
from speckv.services.common.compiled_code import STAMP_FILE, PackageRoots, choose, source_digest
from speckv.services.scheduler.adapters.compiled_start import compiled_index

# The first three start a scheduler on the source: not when these tests themselves run on a build
# (PYTHONPATH=build/sim-compiled), which the child inherits.
on_source = pytest.mark.skipif(compiled_index() is not None, reason="the tests run on a compiled build")


def _start(*args: str) -> tuple[subprocess.Popen, list[str]]:
    """A scheduler on a free port; returns it once listening, and its log so far."""
    process = subprocess.Popen([sys.executable, "-m", "speckv.services.cli", "scheduler", "--port", "0", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        lines.append(line)
        if re.search(r"listening on (\S+)", line):
            return process, lines
        if not line and process.poll() is not None:
            return process, lines
    process.kill()
    raise AssertionError("the scheduler did not start:\n" + "".join(lines))


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


@on_source
def test_on_without_a_build_refuses_to_start(tmp_path):
    process, lines = _start("--compiled", "on", "--compiled-dir", str(tmp_path / "none"))
    assert process.wait(timeout=60) == 2
    assert "--compiled on: no compiled build in" in "".join(lines)


@on_source
def test_a_current_build_re_starts_the_same_process_on_it_once(tmp_path: Path):
    """A stamped copy of the source without extensions: the process re-starts
    on it (its pid and arguments kept, the marker in its environment), finds
    itself still on source modules, says so and serves rather than loop."""
    roots = PackageRoots.of_installed()
    tree = tmp_path / "build"
    copy_package(roots, tree)
    (tree / STAMP_FILE).write_text(json.dumps({"digest": source_digest(roots)}))
    process, lines = _start("--compiled", "on", "--compiled-dir", str(tree))
    try:
        log = "".join(lines)
        assert f"code: mypyc-compiled modules from {tree}: re-starting on it" in log, log
        assert "still the source's: running on the source" in log, log
        assert re.search(r"listening on", log), log
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        assert b"SPECKV_COMPILED_RESTARTED=1" in environ
        assert any(entry.startswith(b"PYTHONPATH=" + str(tree).encode()) for entry in environ)
    finally:
        _stop(process)


@on_source
def test_off_stays_on_the_source(tmp_path):
    process, lines = _start("--compiled", "off")
    try:
        assert "code: python source (--compiled off)" in "".join(lines)
        assert b"SPECKV_COMPILED_RESTARTED=1" not in Path(f"/proc/{process.pid}/environ").read_bytes()
    finally:
        _stop(process)


@pytest.mark.skipif(choose("auto", None)[0] is None, reason="no current compiled build (make sim-compiled)")
def test_the_real_build_runs_the_compiled_index():
    process, lines = _start("--compiled", "on")
    try:
        assert re.search(r"code: mypyc-compiled modules \(\S+holder_index\S+\.so\)", "".join(lines)), "".join(lines)
    finally:
        _stop(process)
