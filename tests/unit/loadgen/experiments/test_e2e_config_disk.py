"""The e2e configuration's disk tier: off in the committed cluster, a
disks.json profile for the engine's GPUs when a file asks for one."""
from __future__ import annotations

import json

import pytest

from speckv.loadgen.experiments.e2e_config import DEFAULT_E2E_PATH, load_e2e_config
from speckv.loadgen.sim.settings import SimSettings
from speckv.services.common.disks import get_disk
from speckv.services.common.errors import InvalidArgument


def variant(tmp_path, **cluster):
    raw = json.loads(DEFAULT_E2E_PATH.read_text())
    raw["cluster"].update(cluster)
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps(raw))
    return path, raw


def test_the_committed_cluster_has_no_disk_tier():
    config = load_e2e_config()
    assert config.disk_pages == 0 and SimSettings.from_e2e(config).disk_pages == 0


def test_a_named_disk_profile_resolves_for_the_engine_s_gpus(tmp_path):
    path, _ = variant(tmp_path, disk_pages=1000, disk="nvme-gen5")
    config = load_e2e_config(path)
    assert config.disk_pages == 1000
    assert config.disk == get_disk("nvme-gen5").model(config.profile.tensor_parallel)
    settings = SimSettings.from_e2e(config, disk_pages=7)
    assert settings.disk_pages == 7 and settings.disk == config.disk


def test_a_disk_without_a_host_tier_or_with_an_unknown_profile_is_refused(tmp_path):
    path, _ = variant(tmp_path, disk_pages=1000, host_pages=0)
    with pytest.raises(InvalidArgument, match="disk_pages must be >= 0 and needs a host tier"):
        load_e2e_config(path)
    path, _ = variant(tmp_path, disk="floppy")
    with pytest.raises(InvalidArgument, match="cluster.disk: disk='floppy' is unknown"):
        load_e2e_config(path)
