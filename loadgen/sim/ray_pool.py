"""`speckv simulate --ray [ADDRESS]`: the simulations of one command as Ray
tasks instead of on the local process pool (pool.py), with the same results.

Where they run:
- `--ray` alone starts a local Ray instance for the command (num_cpus: --jobs,
  default one more than the cores, as the pool), without its dashboard, and
  shuts it down at the end.
- `--ray auto` joins the cluster `ray start` runs on this machine;
  `--ray ray://HOST:PORT` (Ray Client) or `--ray HOST:PORT` (a head node's GCS
  address) joins a remote one. --jobs, if given, caps the tasks in flight;
  otherwise the cluster's CPUs do. A cluster with Ray's token authentication
  (the default of `ray start` since 2.5x) needs RAY_AUTH_MODE=token and its
  token (RAY_AUTH_TOKEN, or ~/.ray/auth_token) in this command's environment:
  Ray reads them, speckv passes nothing.

What travels: each task gets its Job (jobs.py: paths, slice, policy, sweep
cell, ...); the LightGBM and session-return models trained once in this
process go into Ray's object store once (ray.put) and every task reads them
from there, not one pickled copy per Job. The code: with a local instance,
the workers are this machine's Python with the package installed, and the
compiled build is put first on their PYTHONPATH (what pool.worker_environment
does for spawned workers). With an address, the package itself travels as the
job's working_dir: the compiled tree when it matches the source (a copy of the
whole package with the extensions beside the sources, so a worker whose Python
or platform cannot load the extensions imports the .py files next to them),
else a copy of the source. Every result says what its worker ran ("code"), so
a fallback to the source shows in the JSON's "code" and on the console.
Files a Job names (--trace, --config, --scenarios, --events-file) are read
by the worker at the same absolute path: on a remote cluster they must be on
a filesystem every node mounts there.

Invariants, as the pool keeps them: one simulation per worker process
(max_calls=1: a finished simulation's memory goes back and its peak_rss_mb is
its own); a dead worker is not retried (max_retries=0) and fails the run with
ResourceExhausted; submission longest first (pool.submission_order); the
progress bars are the pool's, fed through a Ray queue. Results are bit for bit
the pool's: a simulation is deterministic in its Job, whatever process runs it
(tests/unit/loadgen/sim/test_ray_pool.py compares the JSON of both).

Ray is an optional extra (`pip install -e '.[ray]'`) and is imported only
here, only under --ray.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from speckv.loadgen.sim.compiled import PackageRoots, copy_package
from speckv.loadgen.sim.jobs import Job, SimulationResult, run_job
from speckv.loadgen.sim.pool import BLAS_THREAD_VARS, default_jobs, submission_order
from speckv.loadgen.sim.predictor import TrainedPredictor
from speckv.loadgen.sim.returns import TrainedReturns
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable

LOCAL = "local"  # what `--ray` alone stands for: start a local instance
INSTALL_HINT = "pip install -e '.[ray]' (the ray extra pins ray==2.60.0)"
CONNECT_TIMEOUT_S = 5.0  # a TCP check of HOST:PORT before Ray's own, much longer, retries
POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class RayTarget:
    """Where the tasks run. address None: a local instance this command
    starts; "auto", "ray://HOST:PORT" or "HOST:PORT": a running cluster."""

    address: str | None

    @classmethod
    def parse(cls, value: str) -> RayTarget:
        """`--ray`'s value (LOCAL when given alone); a malformed address is InvalidArgument."""
        if value == LOCAL:
            return cls(None)
        if value == "auto" or _host_port(value) is not None:
            return cls(value)
        raise InvalidArgument(f"--ray {value!r}: give no address (a local Ray), auto, ray://HOST:PORT or HOST:PORT")

    def describe(self) -> str:
        return "a local Ray instance" if self.address is None else f"the Ray cluster at {self.address}"


def _host_port(address: str) -> tuple[str, int] | None:
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def import_ray() -> Any:
    """The ray module, or FailedPrecondition saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise FailedPrecondition(f"--ray needs Ray, which is not installed ({e}): {INSTALL_HINT}") from None
    return ray


def preflight(target: RayTarget) -> None:
    """What can fail before any training or simulation starts: Ray missing, or
    the address not answering (Ray's client waits 30 s, and a GCS address
    retries for minutes, before saying so)."""
    import_ray()
    where = _host_port(target.address) if target.address else None
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise Unavailable(f"--ray {target.address}: nothing answers at {where[0]}:{where[1]} ({e}); is the Ray "
                          "head running (`ray start --head`), and is its port reachable from here?") from None


def _simulate(job: Job, trained: TrainedPredictor | None, returns: TrainedReturns | None,
              progress: Any) -> SimulationResult:
    """One task: the Job with the models the object store handed over."""
    return run_job(replace(job, trained=trained, returns=returns), progress)


@dataclass(slots=True)
class RayRun:
    """The results, and how many simulations could run at once (the pool's `workers`)."""

    results: list[SimulationResult]
    workers: int


def run_on_ray(jobs: Sequence[Job], target: RayTarget, jobs_at_once: int | None, console: Any,
               code_path: Path | None = None, environ: Mapping[str, str] | None = None) -> RayRun:
    """Every Job as a Ray task; results in completion order, as run_all gives them."""
    ray = import_ray()
    environ = os.environ if environ is None else environ
    with _runtime_env(target, code_path, jobs_at_once, len(jobs), environ) as (runtime_env, num_cpus, shipped):
        _init(ray, target, num_cpus, runtime_env)
        try:
            cap = jobs_at_once or num_cpus or int(ray.cluster_resources().get("CPU", 1))
            workers = max(1, min(cap, len(jobs)))
            console.print(f"ray: {target.describe()}, {workers} simulations at once; code {shipped}", markup=False)
            results = _run(ray, jobs, workers, console)
        finally:
            ray.shutdown()
    if code_path is not None and any(r.code == "python" for r in results):
        console.print(f"code: {sum(r.code == 'python' for r in results)} of {len(results)} simulations ran on the "
                      "python source: the compiled extensions do not load on their Ray workers (another Python "
                      "or platform); the JSON's \"code\" says so", markup=False)
    return RayRun(results, workers)


@contextlib.contextmanager
def _runtime_env(target: RayTarget, code_path: Path | None, jobs_at_once: int | None, n_jobs: int,
                 environ: Mapping[str, str]) -> Iterator[tuple[dict[str, Any], int | None, str]]:
    """(runtime_env, num_cpus of a local instance or None, what the code line says)."""
    cores = os.cpu_count() or 1
    num_cpus = min(jobs_at_once or default_jobs(cores), n_jobs) if target.address is None else None
    # As the pool: the user's BLAS settings, else the cores shared among the
    # simulations running at once (on a cluster, one each: a task holds one CPU).
    blas = str(max(1, cores // num_cpus)) if num_cpus else "1"
    env_vars = {key: environ.get(key, blas) for key in BLAS_THREAD_VARS}
    if target.address is None:
        if code_path is not None:
            env_vars["PYTHONPATH"] = os.pathsep.join([str(code_path), *filter(None, [environ.get("PYTHONPATH")])])
        yield {"env_vars": env_vars}, num_cpus, (f"mypyc-compiled from {code_path} (PYTHONPATH)" if code_path
                                                  else "python source (installed package)")
        return
    if code_path is not None:
        yield {"env_vars": env_vars, "working_dir": str(code_path)}, None, \
            f"mypyc-compiled from {code_path}, shipped as the job's working_dir"
        return
    staging = Path(tempfile.mkdtemp(prefix="speckv-ray-"))
    try:
        copy_package(PackageRoots.of_installed(), staging)
        yield {"env_vars": env_vars, "working_dir": str(staging)}, None, \
            "python source, shipped as the job's working_dir"
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _init(ray: Any, target: RayTarget, num_cpus: int | None, runtime_env: dict[str, Any]) -> None:
    """ray.init, with a cluster that does not answer as Unavailable."""
    try:
        if target.address is None:
            # A throwaway instance for one command, nothing to look at in a
            # dashboard. address="local": without it ray.init joins a cluster
            # `ray start` left running on this machine, with its own CPU count.
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING,
                     runtime_env=runtime_env)
        else:
            ray.init(address=target.address, logging_level=logging.WARNING, runtime_env=runtime_env)
    except ConnectionError as e:
        # A port that answers but refuses us is, on Ray 2.5x, most often token authentication.
        auth = "" if os.environ.get("RAY_AUTH_MODE") else (
            "; if the cluster uses token authentication, set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN "
            "(`ray get-auth-token` on the head prints it)")
        raise Unavailable(f"--ray {target.address}: {e}{auth}") from None


def _run(ray: Any, jobs: Sequence[Job], workers: int, console: Any) -> list[SimulationResult]:
    """Submits at most `workers` tasks at a time, longest first, and feeds the bars."""
    from ray.util.queue import Queue

    task = ray.remote(num_cpus=1, max_calls=1, max_retries=0)(_simulate)
    # Each distinct model once into the object store; the Jobs travel without them.
    models: dict[int, Any] = {}
    for j in jobs:
        for model in (j.trained, j.returns):
            if model is not None and id(model) not in models:
                models[id(model)] = ray.put(model)

    def ref(model: object | None) -> Any:
        return None if model is None else models[id(model)]

    columns = (TextColumn("{task.description:>24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    results: list[SimulationResult] = []
    queue = Queue(actor_options={"num_cpus": 0})
    waiting = list(submission_order(list(jobs)))
    running: dict[Any, Job] = {}
    try:
        with Progress(*columns, console=console) as bar:
            bars = {j.label: bar.add_task(j.label, total=None) for j in jobs}
            while waiting or running:
                while waiting and len(running) < workers:
                    job = waiting.pop(0)
                    running[task.remote(replace(job, trained=None, returns=None), ref(job.trained),
                                        ref(job.returns), queue)] = job
                # Returns what finished within POLL_S: the poll that paces the bars.
                done, _ = ray.wait(list(running), num_returns=len(running), timeout=POLL_S)
                pending_updates = queue.qsize()
                for label, finished, total in queue.get_nowait_batch(pending_updates) if pending_updates else ():
                    bar.update(bars[label], completed=finished, total=total)
                for r in done:
                    running.pop(r)
                    results.append(_result_of(ray, r, workers))
    finally:
        for r in running:
            ray.cancel(r, force=True)
        with contextlib.suppress(Exception):
            ray.kill(queue.actor)
    return results


def _result_of(ray: Any, ref: Any, workers: int) -> SimulationResult:
    """A finished task's result; a worker that died (Ray's memory monitor or
    the kernel's out-of-memory killer, most often) is ResourceExhausted naming
    the fix. A simulation's own error reaches the caller as its own class."""
    from ray.exceptions import NodeDiedError, OutOfMemoryError, WorkerCrashedError

    try:
        return ray.get(ref)
    except (OutOfMemoryError, WorkerCrashedError, NodeDiedError) as e:
        raise ResourceExhausted(
            f"a simulation's Ray worker died before it finished ({workers} ran at once): {type(e).__name__}. The "
            "usual cause is memory: each simulation's peak is its JSON's peak_rss_mb (about 1.2 GB for the 256-node "
            "hour, 3 GB at 1,024 nodes); rerun with fewer --jobs or on nodes with more memory") from None
