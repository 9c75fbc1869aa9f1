"""The worker pool of `speckv simulate`: which build the workers run, how
many run at once, in which order the simulations are submitted, and what a
dead worker means.

Each (node count, policy) simulation runs in a worker process of its own:
spawned, never forked, and never reused (max_tasks_per_child=1), so a
finished simulation's memory goes back to the machine and its `peak_rss_mb`
is its own. Workers exit with the command (parent_watch.py).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Mapping, Sequence

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from speckv.loadgen.sim.jobs import Job, SimulationResult, run_job
from speckv.loadgen.sim.parent_watch import exit_with_parent
from speckv.services.common.compiled_code import choose
from speckv.services.common.errors import ResourceExhausted
from speckv.services.scheduler.policies.registry import FORECAST_POLICIES

# Each worker's BLAS pool: numpy's OpenBLAS starts one thread per core in every
# process, so two workers on two cores ran four busy-waiting threads in the
# predictor's ring products.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def worker_environment(code_path: Path | None, blas_threads: int, environ: Mapping[str, str]):
    """What spawned workers start with: sys.path with the compiled build
    first (this process keeps the modules it already imported, and imports
    new speckv modules through the package it has, so only the workers run
    compiled code), and blas_threads BLAS threads each unless the user's
    environment sets its own."""
    saved_path = list(sys.path)
    saved_env = {k: os.environ.get(k) for k in BLAS_THREAD_VARS}
    if code_path is not None:
        sys.path.insert(0, str(code_path))
    for key in BLAS_THREAD_VARS:
        if key not in environ:
            os.environ[key] = str(blas_threads)
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def compiled_build(mode: str, folder: str | None) -> tuple[Path | None, str]:
    """The compiled build to run on (None: the source), and a line saying which and why."""
    return choose(mode, folder)


def default_jobs(cores: int) -> int:
    """Simulations run at once by default: one more than the cores. A
    simulation cannot be split, so with exactly one per core the last round
    leaves cores idle while the longest jobs finish (five policies on two
    cores: one worker runs three of them). One more process than cores
    shares the cores among the jobs still running, which keeps every core
    busy to near the end (docs/performance.md, "Workers")."""
    return max(1, cores) + 1


def submission_order(jobs: Sequence[Job]) -> list[Job]:
    """Longest first, so the short ones fill the last round instead of a
    worker idling while the longest runs alone at the end (longest
    processing time first). A job's cost grows with its node count, and at
    one count the policies that run the predictor (FORECAST_POLICIES) take
    the longest. Otherwise the order given."""
    return sorted(jobs, key=lambda j: (-j.nodes, j.policy not in FORECAST_POLICIES))


def run_all(jobs: list[Job], workers: int, console, code_path: Path | None = None,
            environ: Mapping[str, str] | None = None) -> list[SimulationResult]:
    columns = (TextColumn("{task.description:>24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    results: list[SimulationResult] = []
    with Progress(*columns, console=console) as bar:
        tasks = {j.label: bar.add_task(j.label, total=None) for j in jobs}
        ctx = multiprocessing.get_context("spawn")
        blas_threads = max(1, (os.cpu_count() or 1) // workers)
        manager = SyncManager(ctx=ctx)  # serves the progress queue; it too exits with this process
        with worker_environment(code_path, blas_threads, os.environ if environ is None else environ):
            manager.start(exit_with_parent, (os.getpid(),))
            with manager, ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=exit_with_parent,
                                              initargs=(os.getpid(),), max_tasks_per_child=1) as pool:
                queue = manager.Queue()
                futures = [pool.submit(run_job, j, queue) for j in submission_order(jobs)]
                pending = set(futures)
                while pending:
                    while not queue.empty():
                        label, done, total = queue.get()
                        bar.update(tasks[label], completed=done, total=total)
                    finished = {f for f in pending if f.done()}
                    for f in finished:
                        results.append(result_of(f, workers))
                    pending -= finished
                    time.sleep(0.2)
    return results


def result_of(future, workers: int) -> SimulationResult:
    """A finished simulation's result; a worker that died (the kernel's
    out-of-memory killer, most often) is a ResourceExhausted naming the fix."""
    try:
        return future.result()
    except BrokenProcessPool:
        raise ResourceExhausted(
            f"a simulation worker died before it finished ({workers} ran at once). The usual cause is memory: "
            "each simulation's peak is its JSON's peak_rss_mb (about 1.2 GB for the 256-node hour, 3 GB at "
            "1,024 nodes); rerun with fewer --jobs") from None
