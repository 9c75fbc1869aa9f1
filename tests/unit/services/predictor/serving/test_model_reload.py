"""reload_model's errors hold none of the server's paths (issue 43, item 5):
the root's absolute spellings are replaced, the caller's name is kept, and
the original error stays as the cause for the server's log."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.errors import InvalidArgument, NotFound
from speckv.services.predictor.serving.core import PredictorCore, PredictorSettings
from speckv.services.predictor.serving.count_models import EwmaModel, EwmaParams
from speckv.services.predictor.serving.model_reload import ROOT_SHOWN, reload_model, without_server_paths


def test_every_absolute_spelling_of_the_root_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    root = str(tmp_path / "link")
    message = f"{root}/m: x; {os.path.realpath(root)}/m/manifest.json: y; {root}/: z"
    assert without_server_paths(message, root, "m") == f"{ROOT_SHOWN}/m: x; {ROOT_SHOWN}/m/manifest.json: y; " \
                                                       f"{ROOT_SHOWN}/: z"


def test_a_relative_root_and_no_root_leave_the_message_alone() -> None:
    assert without_server_paths("models: bad", "", "m") == "models: bad"
    text = "the models in service: fine"
    assert without_server_paths(text, "models", "m").startswith("the models in service")


def test_a_reload_error_names_the_model_and_keeps_the_original_as_cause(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    core = PredictorCore(ManualClock(0.0), EwmaModel(EwmaParams(version="v1")),
                         PredictorSettings(model_root=str(tmp_path)))
    with pytest.raises(NotFound) as caught:
        reload_model(core, "empty")
    assert str(caught.value).startswith("model 'empty': ") and str(tmp_path) not in str(caught.value)
    with pytest.raises(InvalidArgument) as caught:
        reload_model(core, "../empty")
    assert caught.value.__cause__ is None  # already clean: raised as it was


@pytest.mark.parametrize("length", [129, 10_000])
def test_an_overlong_name_is_cut_in_the_error_so_its_status_fits_grpc_metadata(tmp_path: Path, length: int) -> None:
    """A whole 10 KB name in the status message went past gRPC's 8 KiB soft
    metadata limit, where the client drops the call at random
    (RESOURCE_EXHAUSTED instead of INVALID_ARGUMENT). Names longer than a
    directory name may be (128) are cut to their first 80 characters."""
    core = PredictorCore(ManualClock(0.0), EwmaModel(EwmaParams(version="v1")),
                         PredictorSettings(model_root=str(tmp_path)))
    with pytest.raises(InvalidArgument) as caught:
        reload_model(core, "a" * length)
    message = str(caught.value)
    assert "a" * 81 not in message and "a" * 80 + "..." in message and len(message) < 400
