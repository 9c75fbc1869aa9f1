"""ReloadModel's names under the model root (model_root.py): one path
component of a strict pattern, resolved (symlinks followed) strictly under
the root; the refusals are the caller's or the server's codes, never a bug."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from speckv.services.predictor.serving.model_root import refuse_path, resolve_model_name


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root" / "v1").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return tmp_path / "root"


def test_a_directory_under_the_root_resolves(root: Path) -> None:
    assert resolve_model_name(str(root), "v1") == Path(os.path.realpath(root / "v1"))
    (root / "current").symlink_to("v1", target_is_directory=True)  # a symlink within the root is followed
    assert resolve_model_name(str(root), "current") == Path(os.path.realpath(root / "v1"))
    (root / "online-3-step1200_a.b").mkdir()  # the retrainer's version names are valid names
    assert resolve_model_name(str(root), "online-3-step1200_a.b").name == "online-3-step1200_a.b"


@pytest.mark.parametrize("name", ["", ".", "..", "../outside", "a/b", "/etc", ".hidden", "-x", "a\x00b",
                                  "a" * 129, "v1\n", "é"])
def test_malformed_names_are_invalid_argument(root: Path, name: str) -> None:
    with pytest.raises(InvalidArgument, match="name"):
        resolve_model_name(str(root), name)
    with pytest.raises(InvalidArgument, match="name"):  # the name first, whatever the server's state
        resolve_model_name("", name)


def test_symlinks_leading_out_of_the_root_are_refused(root: Path, tmp_path: Path) -> None:
    (root / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    (root / "itself").symlink_to(".", target_is_directory=True)
    for name in ("escape", "dangling", "itself"):
        with pytest.raises(FailedPrecondition, match="outside the model root") as caught:
            resolve_model_name(str(root), name)
        assert str(tmp_path) not in str(caught.value)  # the target is not echoed back


def test_absent_names_files_and_missing_roots(root: Path, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        resolve_model_name(str(root), "absent")
    (root / "file").write_text("x")
    with pytest.raises(NotFound):
        resolve_model_name(str(root), "file")
    with pytest.raises(FailedPrecondition, match="no model root"):
        resolve_model_name("", "v1")
    with pytest.raises(FailedPrecondition, match="not a directory"):
        resolve_model_name(str(tmp_path / "missing-root"), "v1")


def test_a_path_is_refused() -> None:
    refuse_path("")
    with pytest.raises(InvalidArgument, match="pass name"):
        refuse_path("/models/v1")
