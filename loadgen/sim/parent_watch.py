"""Simulation workers end when `speckv simulate` does.

A ProcessPoolExecutor worker does not notice its parent dying: killed with
SIGTERM (a timeout, a CI job cancelled, `kill`), the parent exits at once and
its workers keep simulating, a 1,024-node job for tens of minutes, on the
cores the next run needs. Each worker therefore starts a daemon thread that
checks once every poll_s whether its parent is still the process that
started it, and exits the worker at once when not (an orphan is re-parented,
so its parent pid changes). The progress queue's manager process watches
the same way. Polling, not PR_SET_PDEATHSIG, because that is
Linux-only and fires when the parent *thread* exits, not the process.
"""
from __future__ import annotations

import os
import threading
import time

POLL_S = 1.0
ORPHANED_EXIT_CODE = 3


def exit_with_parent(parent_pid: int, poll_s: float = POLL_S) -> threading.Thread:
    """Starts the watch (call it in the worker, first thing); returns its thread."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(ORPHANED_EXIT_CODE)  # no cleanup to wait for: the results have nowhere to go

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread
