"""Imports NIXL's Python API if it is installed, once per process.

NIXL is optional (the Makefile's .installed-nixl stamp, pyproject's `nixl`
extra): without it the kvstore runs and `--transport auto` carries what nixl
would have carried over tcp. The first time NIXL is found missing (or turned
off) ONE line says so and why (a warning when it was asked for and is
missing, information when it was not asked for); later calls return None
silently.

NIXL is off unless the kvstore is started with --nixl (SPECKV_NIXL=true; the
server passes the opposite in as `disabled`): importing nixl and starting
its UCX backend takes seconds (registering the pools does not:
docs/dataplane.md).
"""
from __future__ import annotations

import importlib
import logging
import os
import threading
from types import ModuleType
from typing import Callable

log = logging.getLogger(__name__)

# The meta package `nixl` picks the build (cu13, cu12, rocm); without it (the extra installs
# nixl-cu13 alone) the build's own API module serves.
MODULES = ("nixl._api", "nixl_cu13._api")
MISSING_LINE = ("NIXL unavailable ({why}): --transport auto uses tcp where nixl would carry a replication "
                "(install: make .venv/.installed-nixl, or pip install --no-deps nixl==1.5.1 nixl-cu13==1.5.1)")


class NixlLoader:
    """Remembers the outcome of the import; says the missing line once."""

    def __init__(self, importer: Callable[[str], ModuleType] = importlib.import_module,
                 logger: logging.Logger = log) -> None:
        self._importer = importer
        self._log = logger
        self._lock = threading.Lock()
        self._api: ModuleType | None = None
        self._tried = False
        self._said = False

    def api(self, disabled: bool = False) -> ModuleType | None:
        """NIXL's API module (it has nixl_agent and nixl_agent_config), or
        None when it is missing or disabled."""
        with self._lock:
            if disabled:
                self._say("off: --nixl not given", logging.INFO)
                return None
            if not self._tried:
                self._tried = True
                self._api, why = self._import()
                if self._api is None:
                    self._say(why)
            return self._api

    def _say(self, why: str, level: int = logging.WARNING) -> None:
        if not self._said:
            self._said = True
            self._log.log(level, MISSING_LINE.format(why=why))

    def _import(self) -> tuple[ModuleType | None, str]:
        errors = []
        for name in MODULES:
            try:
                module = self._importer(name)
            except Exception as exc:  # noqa: BLE001 - a broken install (a missing library) is missing too
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
                continue
            if hasattr(module, "nixl_agent"):
                _quiet_nixl_logger()
                return module, ""
            errors.append(f"{name}: no nixl_agent")
        return None, "; ".join(errors)


def _quiet_nixl_logger() -> None:
    """NIXL's Python logger prints INFO lines to stdout with its own handler
    (the kvstore's stdout carries its address line for tools): warnings only,
    unless NIXL_LOG_LEVEL asks otherwise. The kvstore logs the agent's start."""
    if not os.environ.get("NIXL_LOG_LEVEL"):
        logging.getLogger("nixl").setLevel(logging.WARNING)


LOADER = NixlLoader()  # the process's one import of NIXL
