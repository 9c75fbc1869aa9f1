"""Starts the scheduler process on the mypyc-compiled build when asked to.

The build (services/common/compiled_code.py) is a whole copy of the package;
a process can only run from it if it imports speckv from there from the
start. So a scheduler that should run compiled and was started on the
source replaces itself (execve: the same pid, arguments and environment)
with `python -m speckv.services.cli scheduler ARGS`, the build first on
PYTHONPATH. `--compiled auto` does so when the build matches the source (a
stale or missing build: the source, said in the log), `on` refuses to start
without a current build, `off` never does. The new process finds itself
compiled and carries on; one that was re-started and still is not compiled
(a path that does not reach the build) says so and runs on the source
rather than restart again (the marker variable below).
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Mapping, Sequence

from speckv.services.common.compiled_code import choose, is_compiled

log = logging.getLogger(__name__)

RESTARTED = "SPECKV_COMPILED_RESTARTED"  # set in the environment of the re-started process


def compiled_index() -> str | None:
    """The file of this process's holder index when it is the compiled one; else None."""
    from speckv.services.scheduler import holder_index
    return holder_index.__file__ if is_compiled(holder_index.__file__) else None


def restart_compiled(mode: str, folder: str, argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """Returns when this process should run as it is; otherwise replaces it
    (never returns). FailedPrecondition: mode on without a current build."""
    if (compiled := compiled_index()) is not None:
        log.info("code: mypyc-compiled modules (%s)", compiled)
        return
    if environ.get(RESTARTED):  # before choose(): the package this process sees is the build's copy
        log.warning("re-started on %s but the modules are still the source's: running on the source",
                    environ.get("PYTHONPATH", "").split(os.pathsep)[0])
        return
    tree, line = choose(mode, folder or None)
    if tree is None:
        log.info("%s", line)
        return
    env = dict(environ)
    env[RESTARTED] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), environ.get("PYTHONPATH", "")) if p)
    log.info("%s: re-starting on it", line)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.execve(sys.executable, [sys.executable, "-m", "speckv.services.cli", "scheduler", *argv], env)
