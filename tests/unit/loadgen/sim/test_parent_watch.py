"""Simulation workers end when their parent does (loadgen/sim/parent_watch.py):
a real process tree, the middle process killed with SIGKILL, as `kill -9`
or a cancelled CI job leaves it. The worker alone holds the write end of a
pipe the test reads, so the pipe's end of file is the worker's exit (an
orphan's exit status goes to init, not to the test)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

# The middle process: starts a worker that watches it and inherits fd WRITE_FD, waits.
PARENT = """
import os, subprocess, sys, time
fd = int(sys.argv[1])
worker = subprocess.Popen([sys.executable, "-c", "import os, time\\n"
    "from speckv.loadgen.sim.parent_watch import exit_with_parent\\n"
    "exit_with_parent( os.getppid(), poll_s=0.05)\\n"
    "print('watching', flush=True)\\n"
    "time.sleep(600)"], stdout=subprocess.PIPE, text=True, pass_fds=(fd,))
os.close(fd)
assert worker.stdout.readline().strip() == "watching"
print("started", flush=True)
time.sleep(600)
"""


def closed_within(fd: int, timeout_s: float) -> bool:
    """True when the pipe reaches end of file (every writer gone) within timeout_s."""
    readable, _, _ = select.select([fd], [], [], timeout_s)
    return bool(readable) and os.read(fd, 1) == b""


def test_a_worker_exits_when_its_parent_is_killed():
    read_fd, write_fd = os.pipe()
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(write_fd)], stdout=subprocess.PIPE, text=True,
                              pass_fds=(write_fd,))
    os.close(write_fd)
    try:
        assert parent.stdout.readline().strip() == "started"
        assert not closed_within(read_fd, 0.5)  # ten polls: the watch leaves a worker whose parent lives
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert closed_within(read_fd, 60)  # a bound so a broken watch fails instead of hanging
    finally:
        parent.kill()
        os.close(read_fd)
