"""The bench's per-call CPU figure: a process's CPU seconds from /proc, and
the CPU a process spent per call of a timed rate run."""
import os
import threading

from speckv.loadgen.bench.scheduler.cli import _cpu_s, _rate_and_cpu


def _spin(n: int) -> int:
    return sum(i * i for i in range(n))


def test_cpu_seconds_grow_with_work_and_not_with_sleep():
    before = _cpu_s(os.getpid())
    _spin(3_000_000)
    busy = _cpu_s(os.getpid()) - before
    assert busy > 0
    before = _cpu_s(os.getpid())
    threading.Event().wait(0.3)
    assert _cpu_s(os.getpid()) - before < busy


def test_cpu_per_call_of_a_rate_run():
    rate, cpu_us = _rate_and_cpu(lambda i: _spin(20_000), 0.5, os.getpid())
    assert rate > 0 and cpu_us > 0  # this process did the work
    idle_rate, idle_us = _rate_and_cpu(lambda i: threading.Event().wait(0.01), 0.5, os.getpid())
    assert idle_rate > 0 and idle_us < cpu_us  # waiting costs this process next to nothing a call
