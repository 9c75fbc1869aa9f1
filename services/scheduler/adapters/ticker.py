"""A background thread that calls a function every interval_s seconds (real
time, Event.wait, never a busy loop) until stopped. A failing call is logged
and the ticking goes on."""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class Ticker:
    def __init__(self, interval_s: float, fn: Callable[[], object], name: str = "scheduler-tick") -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s}: must be > 0")
        self._interval_s = interval_s
        self._fn = fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "Ticker":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._fn()
            except Exception:  # noqa: BLE001 - one bad tick must not end ticking
                log.exception("tick failed")
