"""A policies file under which `reactive-heat` replicates any family seen
once, so a short live slice moves real KV between kvstores (the real-engine
e2e tests); everything else is the committed policies.json."""
from __future__ import annotations

import json
from pathlib import Path

from speckv.loadgen.experiments.e2e_config import DEFAULT_E2E_PATH


def eager_heat_policies(directory: Path) -> Path:
    """Writes the file into directory; returns its path (the scheduler's --policies-path)."""
    policies = json.loads((DEFAULT_E2E_PATH.parent / "policies.json").read_text())
    policies["reactive_heat"].update(heat_threshold=1, heat_per_replica=1)
    path = directory / "policies.json"
    path.write_text(json.dumps(policies))
    return path
