"""Fixtures shared by every test folder."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    from speckv.services.common.traces import resolve_traces_dir

    return resolve_traces_dir(None, {k: v for k, v in os.environ.items() if k == "SPECKV_TRACES"}
                              or {"SPECKV_TRACES": str(REPO_ROOT.parent / "shared" / "traces")})
