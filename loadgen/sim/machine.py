"""What a simulate run ran on, with a speed reference, so wall times from
different machines can be compared.

A simulation is interpreter-bound: its wall time tracks how fast the
machine runs Python more than its core count or clock. The reference is
the best of `repeats` timings (timeit) of one fixed pure-Python loop,
sum(range(1_000_000)), in ms. Two runs' wall times compare after scaling by
their references (docs/performance.md lists the references seen so far).
Measured before the workers start, so the machine is idle; costs a fraction
of a second.
"""
from __future__ import annotations

import os
import platform
import resource
import sys
import timeit
from pathlib import Path

REFERENCE_STATEMENT = "sum(range(1_000_000))"


def reference_loop_ms(repeats: int = 5) -> float:
    """Best of `repeats` timings of REFERENCE_STATEMENT, ms (> 0)."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: must be >= 1")
    return min(timeit.repeat(REFERENCE_STATEMENT, number=1, repeat=repeats)) * 1e3


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name where Linux tells it, else what platform knows ('' if nothing)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor()


def peak_rss_mb(status: Path = Path("/proc/self/status")) -> float:
    """This process's peak resident memory so far, MiB: Linux's VmHWM, which
    exec resets. getrusage's ru_maxrss (the fallback elsewhere: KiB, bytes on
    macOS) is not reset by exec, so on Linux a spawned worker's would start
    at its parent's size."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def memory_mb() -> float | None:
    """The machine's physical memory, MiB; None where sysconf does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 20)
    except (ValueError, OSError, AttributeError):
        return None


def describe_machine(repeats: int = 5) -> dict:
    """The JSON's `machine` entry: cores, memory, CPU model, Python and the reference."""
    memory = memory_mb()
    return {"cores": os.cpu_count() or 1, "memory_mb": round(memory) if memory else None,
            "cpu": cpu_model(), "python": platform.python_version(),
            "reference_statement": REFERENCE_STATEMENT, "reference_loop_ms": round(reference_loop_ms(repeats), 2)}
