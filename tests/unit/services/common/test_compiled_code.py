"""When a compiled build may stand in for the source (services/common/compiled_code.py),
over a small fake package; tests/unit/loadgen/sim/test_compiled.py covers the stamp's digest."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from speckv.services.common.compiled_code import STAMP_FILE, PackageRoots, choose, is_compiled, source_digest
from speckv.services.common.errors import FailedPrecondition


@pytest.fixture
def roots(tmp_path: Path) -> PackageRoots:
    top, services, loadgen = tmp_path / "src" / "speckv", tmp_path / "src" / "services", tmp_path / "src" / "loadgen"
    for folder in (top, services, loadgen):
        folder.mkdir(parents=True)
    (top / "__init__.py").write_text("")
    (services / "core.py").write_text("X = 1\n")
    return PackageRoots({"": top, "services": services, "loadgen": loadgen})


def test_off_is_the_source_and_an_unknown_mode_is_refused(roots, tmp_path):
    assert choose("off", str(tmp_path), roots) == (None, "code: python source (--compiled off)")
    with pytest.raises(FailedPrecondition, match="expected one of auto, on, off"):
        choose("always", None, roots)


def test_auto_takes_a_current_build_only_and_on_refuses_without_one(roots, tmp_path):
    tree = tmp_path / "tree"
    assert choose("auto", str(tree), roots) == (None, f"code: python source; no compiled build in {tree} "
                                                      "(make sim-compiled)")
    with pytest.raises(FailedPrecondition, match="--compiled on: no compiled build"):
        choose("on", str(tree), roots)
    tree.mkdir()
    (tree / STAMP_FILE).write_text(json.dumps({"digest": source_digest(roots)}))
    assert choose("auto", str(tree), roots)[0] == tree and choose("on", str(tree), roots)[0] == tree
    (roots.folders["services"] / "core.py").write_text("X = 2\n")  # an edit: the build is stale
    assert "older than the source" in choose("auto", str(tree), roots)[1]


def test_the_default_build_is_beside_the_loadgen_folder(roots):
    assert "no compiled build in " + str(roots.folders["loadgen"].parent / "build" / "sim-compiled") in \
        choose("auto", None, roots)[1]


def test_a_module_is_compiled_when_it_came_from_an_extension():
    assert is_compiled("/x/holder_index.cpython-311-x86_64-linux-gnu.so")
    assert not is_compiled("/x/holder_index.py") and not is_compiled(None)
