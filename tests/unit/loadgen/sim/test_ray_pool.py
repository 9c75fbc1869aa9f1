"""`speckv simulate --ray`: the simulations as Ray tasks give the process
pool's JSON bit for bit (every figure but what the machine measures), with the
LightGBM and session-return models trained once in the command and handed to
the tasks through Ray, and progress bars fed from the tasks; Ray missing, a
bad address and an address where nothing answers fail before any training,
with errors that say what to do; speckv imports without Ray."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from speckv.loadgen.sim import cli
from speckv.loadgen.sim.ray_pool import RayTarget, _result_of, _runtime_env
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable

# What the machine and the moment set: wall and CPU time, memory, the speed
# reference, and the model's training time, which its description quotes.
MEASURED = {"wall_s", "cpu_s", "events_per_s", "peak_rss_mb", "reference_loop_ms"}
TRAINING_TIME = re.compile(r"\(\d+(\.\d+)? s to train\)")
SLICE = ["--synthetic", "document-bursts", "--nodes", "4", "--start-s", "600", "--duration-s", "20",
         "--policies", "none,predictive", "--predictor", "lightgbm", "--jobs", "2", "--compiled", "off"]


def without_measured(value):
    if isinstance(value, dict):
        return {k: without_measured(v) for k, v in value.items() if k not in MEASURED}
    if isinstance(value, list):
        return [without_measured(v) for v in value]
    return TRAINING_TIME.sub("(- s to train)", value) if isinstance(value, str) else value


def test_ray_tasks_give_the_process_pools_json_exactly(tmp_path, capsys):
    pool_json, ray_json = tmp_path / "pool.json", tmp_path / "ray.json"
    assert cli.main([*SLICE, "--json", str(pool_json)], {}) == 0
    capsys.readouterr()
    # --jobs 2: the local Ray starts with num_cpus=2 (CI has two cores).
    assert cli.main([*SLICE, "--ray", "--json", str(ray_json)], {}) == 0
    out = capsys.readouterr().out
    pool, ray = json.loads(pool_json.read_text()), json.loads(ray_json.read_text())
    assert without_measured(ray) == without_measured(pool)
    # The models travelled: predictive served the LightGBM model and the return model.
    notes = " ".join(ray["notes"])
    assert "predictor LightGBM trained on" in notes and "session-return LightGBM trained on" in notes
    assert ray["code"] == "python"
    assert "ray: a local Ray instance, 2 simulations at once" in out
    for label in ("4 nodes none", "4 nodes predictive"):  # the bars reached their totals: the queue fed them
        assert re.search(rf"{label} .*?(\d+)/\1\b", out), out


def test_a_dead_ray_worker_is_resource_exhausted_naming_jobs():
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        # What an OOM-killed worker looks like to Ray. A lambda travels by value:
        # the workers cannot import this test module.
        died = ray.remote(max_retries=0)(lambda: os._exit(9)).remote()
        with pytest.raises(ResourceExhausted, match="--jobs") as failed:
            _result_of(ray, died, 3)
        assert "3 ran at once" in str(failed.value)
    finally:
        ray.shutdown()


def test_ray_missing_is_a_failed_precondition_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets without the extra
    with pytest.raises(FailedPrecondition, match=r"pip install -e '\.\[ray\]'"):
        cli.main([*SLICE, "--ray"], {})


def test_an_address_where_nothing_answers_is_unavailable_at_once():
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Unavailable, match=rf"nothing answers at 127\.0\.0\.1:{port}"):
        cli.main([*SLICE, "--ray", f"ray://127.0.0.1:{port}"], {})
    with pytest.raises(InvalidArgument, match="auto, ray://HOST:PORT or HOST:PORT"):
        cli.main([*SLICE, "--ray", "ray://nowhere"], {})


def test_with_an_address_the_package_travels_as_the_working_dir(tmp_path):
    with _runtime_env(RayTarget("ray://head:10001"), None, None, 3, {"OMP_NUM_THREADS": "4"}) as (env, cpus, line):
        staged = Path(env["working_dir"])
        assert (staged / "speckv" / "loadgen" / "sim" / "ray_pool.py").is_file()
        assert (staged / "speckv" / "services" / "config" / "e2e.json").is_file()
        assert cpus is None and "python source" in line
        assert env["env_vars"]["OMP_NUM_THREADS"] == "4" and env["env_vars"]["OPENBLAS_NUM_THREADS"] == "1"
    assert not staged.exists()
    with _runtime_env(RayTarget("auto"), tmp_path, None, 3, {}) as (env, _, line):
        assert env["working_dir"] == str(tmp_path) and "mypyc-compiled" in line
    with _runtime_env(RayTarget(None), tmp_path, 2, 5, {"PYTHONPATH": "/x"}) as (env, cpus, _):
        assert cpus == 2 and env["env_vars"]["PYTHONPATH"].split(":") == [str(tmp_path), "/x"]
        assert "working_dir" not in env


def test_speckv_imports_without_ray():
    script = ("import sys; sys.modules['ray'] = None\n"
              "import speckv.services.cli, speckv.loadgen.sim.cli, speckv.loadgen.sim.ray_pool\n"
              "assert sys.modules['ray'] is None\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
