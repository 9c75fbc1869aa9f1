"""Polling with a deadline, for tests that wait on another thread or process."""
from __future__ import annotations

import threading
from typing import Callable

TIMEOUT = 10.0  # generous: tests share a small, often loaded machine


def wait_until(predicate: Callable[[], object], timeout: float = TIMEOUT, every: float = 0.02) -> bool:
    """True as soon as predicate() is truthy; its last value's truth after timeout seconds."""
    pause = threading.Event()
    for _ in range(int(timeout / every)):
        if predicate():
            return True
        pause.wait(every)
    return bool(predicate())


def wait_for(predicate: Callable[[], object], what: str, within: float, every: float = 0.02) -> None:
    """Returns as soon as predicate() is truthy; fails the test naming what
    it waited for when `within` seconds pass first."""
    import pytest

    if not wait_until(predicate, within, every):
        pytest.fail(f"not within {within} s: {what}")
