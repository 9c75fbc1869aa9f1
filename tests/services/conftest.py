"""Fixtures shared by the service tests."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.predictor_synthetic import save_planted_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A LightGBM model directory (version lgbm-v1) trained on planted counts."""
    return save_planted_model(tmp_path_factory.mktemp("model") / "v1")
