"""The compiled build's stamp: which source it was built from, and when
`speckv simulate` may use it. Over a small fake package (no compiler run
here; tests/e2e/test_sim_compiled.py checks a real build's results)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from speckv.loadgen.sim import jobs, pool
from speckv.loadgen.sim.compiled import (
    HOT_MODULES,
    MYPY_FLAGS,
    STAMP_FILE,
    PackageRoots,
    copy_package,
    current,
    main,
    source_digest,
    why_not_current,
)
from speckv.services.common.errors import FailedPrecondition


@pytest.fixture
def roots(tmp_path: Path) -> PackageRoots:
    top, services = tmp_path / "protos" / "speckv", tmp_path / "services"
    for folder in (top, services / "config", services / "__pycache__"):
        folder.mkdir(parents=True)
    (top / "__init__.py").write_text("")
    (services / "core.py").write_text("X = 1\n")
    (services / "config" / "policies.json").write_text("{}")
    (services / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0")
    (services / "core.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\0")
    return PackageRoots({"": top, "services": services})


def stamp(tree: Path, digest: str) -> None:
    tree.mkdir(parents=True, exist_ok=True)
    (tree / STAMP_FILE).write_text(json.dumps({"digest": digest}))


def test_the_package_files_are_sources_and_data_never_caches_or_builds(roots):
    assert [rel for rel, _ in roots.files()] == ["__init__.py", "services/config/policies.json", "services/core.py"]


@pytest.mark.parametrize("edit", [
    lambda r: (r.folders["services"] / "core.py").write_text("X = 2\n"),
    lambda r: (r.folders["services"] / "config" / "policies.json").write_text('{"a": 1}'),
    lambda r: (r.folders["services"] / "new.py").write_text(""),
    lambda r: (r.folders["services"] / "core.py").rename(r.folders["services"] / "moved.py"),
])
def test_any_source_or_data_edit_changes_the_digest(roots, edit):
    before = source_digest(roots)
    assert source_digest(roots) == before
    edit(roots)
    assert source_digest(roots) != before


def test_caches_and_extensions_do_not_change_the_digest(roots):
    before = source_digest(roots)
    (roots.folders["services"] / "__pycache__" / "x.pyc").write_bytes(b"1")
    (roots.folders["services"] / "router.cpython-311-x86_64-linux-gnu.so").write_bytes(b"1")
    assert source_digest(roots) == before


def test_a_build_is_used_only_while_its_stamp_matches_the_source(roots, tmp_path):
    tree = tmp_path / "build" / "sim-compiled"
    assert "no compiled build" in why_not_current(tree, roots) and current(tree, roots) is None
    tree.mkdir(parents=True)
    (tree / STAMP_FILE).write_text("not json")
    assert "unreadable" in why_not_current(tree, roots)
    stamp(tree, source_digest(roots))
    assert why_not_current(tree, roots) is None and current(tree, roots) == tree
    (roots.folders["services"] / "core.py").write_text("X = 3\n")
    assert "older than the source" in why_not_current(tree, roots) and current(tree, roots) is None


def test_simulate_chooses_the_build_or_the_source_and_says_why(tmp_path, monkeypatch, roots):
    monkeypatch.setattr(PackageRoots, "of_installed", classmethod(lambda cls: roots))
    tree = tmp_path / "tree"
    assert pool.compiled_build("auto", str(tree)) == (None, f"code: python source; no compiled build in {tree} "
                                                           "(make sim-compiled)")
    with pytest.raises(FailedPrecondition, match="--compiled on: no compiled build"):
        pool.compiled_build("on", str(tree))
    stamp(tree, source_digest(roots))
    assert pool.compiled_build("on", str(tree))[0] == tree
    assert pool.compiled_build("auto", str(tree))[0] == tree
    assert pool.compiled_build("off", str(tree)) == (None, "code: python source (--compiled off)")


def test_check_exits_nonzero_on_a_missing_build(tmp_path, capsys):
    assert main(["check", str(tmp_path / "none")]) == 1
    assert "no compiled build" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2


def test_the_hot_modules_exist_in_the_installed_package():
    files = {rel for rel, _ in PackageRoots.of_installed().files()}
    assert set(HOT_MODULES) <= files


def test_no_hot_module_defines_a_class_a_worker_receives_pickled():
    """The parent runs the source and the workers the build: a compiled
    class cannot unpickle the state of its interpreted twin (a TrainedPredictor
    inside a Job once lost its fields that way), so what a Job carries must
    stay interpreted on both sides."""
    from speckv.loadgen.sim.predictor import TrainedPredictor
    from speckv.services.predictor.serving.lgbm_served import LightGbmModel

    carried = [jobs.Job, TrainedPredictor, LightGbmModel]
    hot = {m.removesuffix(".py").replace("/", ".") for m in HOT_MODULES}
    assert not [c.__qualname__ for c in carried if c.__module__.removeprefix("speckv.") in hot]


def test_the_hot_modules_type_check_as_mypyc_needs(tmp_path, monkeypatch):
    """mypyc refuses a module that does not type-check; this says so in
    `make test`, before CI's `make sim-compiled` would fail on it."""
    api = pytest.importorskip("mypy.api", reason="mypy (the sim extra) is not installed")
    copy_package(PackageRoots.of_installed(), tmp_path)
    monkeypatch.chdir(tmp_path)
    out, err, status = api.run([*MYPY_FLAGS, "--cache-dir", str(tmp_path / ".mypy_cache"),
                                *(f"speckv/{m}" for m in HOT_MODULES)])
    assert status == 0, out + err


def test_workers_start_with_the_build_first_and_one_blas_pool_each_unless_the_user_says(tmp_path, monkeypatch):
    import os
    import sys
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    path_before = list(sys.path)
    with pool.worker_environment(tmp_path, 1, {"OMP_NUM_THREADS": "3"}):
        assert sys.path[0] == str(tmp_path)
        assert os.environ["OPENBLAS_NUM_THREADS"] == "1" and os.environ["MKL_NUM_THREADS"] == "1"
        assert os.environ["OMP_NUM_THREADS"] == "3"  # the user's own setting stands
    assert sys.path == path_before and "OPENBLAS_NUM_THREADS" not in os.environ
    assert os.environ["OMP_NUM_THREADS"] == "3"
    with pool.worker_environment(None, 2, {}):
        assert sys.path == path_before and os.environ["OPENBLAS_NUM_THREADS"] == "2"
