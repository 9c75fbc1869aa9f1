"""Starting a real `speckv up` in a test: the process, once it says ready."""
from __future__ import annotations

import subprocess
import sys
import time
from typing import Mapping

import pytest

SPECKV = [sys.executable, "-m", "speckv.services.cli"]
READY_WITHIN_S = 120


def start_up(flags: list[str], env: Mapping[str, str]) -> tuple[subprocess.Popen, str]:
    """`speckv up FLAGS` with env; returns the process and what it printed
    up to its "ready" line (the test fails if it exits before)."""
    process = subprocess.Popen([*SPECKV, "up", *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=dict(env))
    assert process.stdout is not None
    output = []
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        output.append(line)
        if "ready" in line:
            break
        if not line and process.poll() is not None:
            pytest.fail(f"speckv up {' '.join(flags)} exited early:\n" + "".join(output))
    return process, "".join(output)
