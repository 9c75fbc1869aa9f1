"""Where the checkout is, for tests that read its files (compose, kernels, sources)."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
