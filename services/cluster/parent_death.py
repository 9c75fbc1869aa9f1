"""Child services that die with the process that started them, without
running code between fork and exec.

A launcher that forks while gRPC's threads run (a live test, `speckv up`
adding a node, a bench's node event) must not run Python in the forked
child (preexec_fn): gRPC's fork handlers and a dlopen there crash or hang
the child. So the launcher starts the child plainly, naming itself in the
environment (`child_environ`), and the child asks the kernel for SIGTERM
when its parent dies first thing after exec (`die_with_parent`, called by
`speckv`'s entry point). If the parent is already gone by then, the child
stops at once.

Linux counts the *thread* that started the child as its parent: a launcher
that starts children from a short-lived thread must start them from one
that lives as long as they should (LocalCluster's spawner thread).
"""
from __future__ import annotations

import ctypes
import os
import signal
from typing import Mapping

PARENT_PID_ENV = "SPECKV_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def child_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """environ for a child that should die with this process."""
    return {**environ, PARENT_PID_ENV: str(os.getpid())}


def die_with_parent(environ: Mapping[str, str]) -> None:
    """In a child started with child_environ: SIGTERM when the parent dies
    (a no-op elsewhere, or off Linux)."""
    parent = environ.get(PARENT_PID_ENV, "")
    if not parent.isdigit():
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return  # not glibc Linux: no parent-death signal
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # the parent died before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)
