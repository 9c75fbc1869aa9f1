"""docs/limits.md, the one place the services' limits are documented, names
real config fields with their real defaults, flags and variables, and
lists every limit field."""
from __future__ import annotations

import dataclasses
import re

import pytest

from speckv.services.common.config import env_name
from speckv.services.common.rpc.server import ServerSettings
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.predictor.config import PredictorConfig
from speckv.services.scheduler.adapters.config import SchedulerConfig
from tests.support.repo import REPO_ROOT

CLASSES = {"every": ServerSettings, "kvstore": KVStoreConfig, "scheduler": SchedulerConfig,
           "predictor": PredictorConfig}
ROW = re.compile(r"^\| (\w+) \| `(\w+)` \| ([^|]+) \| `(--[\w-]+)` \| `(SPECKV_\w+)` \| ([^|]+) \|$")
LIMITS = {
    "every": {"max_streams", "max_streams_per_peer", "workers", "max_queued_calls", "max_message_mb"},
    "kvstore": {"max_reservation_lease_s", "pin_lease_s", "max_family_chars", "data_max_connections",
                "data_read_timeout_s", "data_unauth_max_connections", "data_unauth_per_address",
                "data_auth_timeout_s", "kv_events_replay_batches"},
    "scheduler": {"max_prompt_tokens", "max_family_chars"},
    "predictor": {"max_families_tracked"},
}


def rows() -> list[tuple[str, ...]]:
    text = (REPO_ROOT / "docs" / "limits.md").read_text()
    return [m.groups() for m in map(ROW.match, text.splitlines()) if m]


@pytest.mark.parametrize("service,name,default,flag,variable,beyond", rows())
def test_each_row_is_a_config_field_as_documented(service, name, default, flag, variable, beyond):
    fields = {f.name: f for f in dataclasses.fields(CLASSES[service])}
    assert name in fields, f"{service} has no field {name}"
    assert str(fields[name].default) == default.strip()
    assert flag == "--" + name.replace("_", "-") and variable == env_name(name)
    assert beyond.strip() in ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT") or beyond.strip().startswith("(")


def test_every_limit_field_has_its_row():
    documented = {(service, name) for service, name, *_ in rows()}
    assert documented == {(service, name) for service, names in LIMITS.items() for name in names}
