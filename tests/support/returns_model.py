"""A small session-return model for the service tests: trained on synthetic
conversations (tests/support/returns_conversations.py) with the
quick hyperparameters, saved as a --returns-model directory."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from speckv.services.predictor.fitting.returns.config import ReturnConfig, load_return_config
from speckv.services.predictor.fitting.returns.training import train_before
from speckv.services.predictor.serving.returns.model import ReturnModel
from speckv.services.predictor.serving.returns.store import save_return_model
from tests.support.returns_conversations import conversations

CONFIG: ReturnConfig = load_return_config(quick=True)
VERSION = "returns-synthetic-v1"


@lru_cache(maxsize=1)
def synthetic_model() -> ReturnModel:
    """Trained once per process on 400 synthetic conversations (an hour of them)."""
    trained = train_before(conversations(400, 3600.0, seed=2), 3600.0, CONFIG)
    assert trained is not None
    return trained.model


def save_synthetic_model(directory: Path) -> Path:
    return save_return_model(directory, synthetic_model(), CONFIG.features, VERSION, "synthetic conversations")
