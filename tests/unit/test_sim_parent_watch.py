"""Simulation workers end when their parent does (loadgen/sim/parent_watch.py):
a real process tree, the middle process killed with SIGKILL, as `kill -9`
or a cancelled CI job leaves it."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The middle process: starts a worker that watches it, prints the worker's pid, waits.
PARENT = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import os, time\\n"
    "from speckv.loadgen.sim.parent_watch import exit_with_parent\\n"
    "exit_with_parent(os.getppid(), poll_s=0.05)\\n"
    "print('watching', flush=True)\\n"
    "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
assert worker.stdout.readline().strip() == "watching"
print(worker.pid, flush=True)
time.sleep(600)
"""


def running(pid: int) -> bool:
    """True while pid exists and is not a zombie (an orphan's zombie waits for init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_worker_exits_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        time.sleep(0.5)  # ten polls: the watch leaves a worker whose parent lives
        assert running(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 60  # a bound so a broken watch fails instead of hanging
        while running(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(worker)
    finally:
        parent.kill()

