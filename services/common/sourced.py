"""Reading a JSON file of named profiles whose every figure must say where it
comes from (services/config/links.json, disks.json): the file's section of
profiles, and the check that a profile cites a source for each figure.
InvalidArgument names the file and the profile."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from speckv.services.common.errors import InvalidArgument


def load_section(source: Path, key: str, what: str) -> dict[str, object]:
    """The non-empty object under `key` of the JSON file; `what` names the file's kind in errors."""
    try:
        raw = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"{what} {source}: {exc}") from None
    section = raw.get(key) if isinstance(raw, dict) else None
    if not isinstance(section, dict) or not section:
        raise InvalidArgument(f"{what} {source}: expected a non-empty '{key}' object")
    return section


def sources_of(where: str, spec: object, fields: Sequence[str], how: str) -> dict[str, str]:
    """The profile's `sources`, one non-blank entry per field in fields; `how`
    says what a source may be (in the error)."""
    if not isinstance(spec, dict):
        raise InvalidArgument(f"{where}: expected an object")
    sources = spec.get("sources")
    if not isinstance(sources, dict):
        raise InvalidArgument(f"{where} has no sources: every figure ({', '.join(fields)}) "
                              "must say where it comes from")
    missing = [key for key in fields if not str(sources.get(key, "")).strip()]
    if missing:
        raise InvalidArgument(f"{where}: no source for {', '.join(missing)}: every figure must say where "
                              f"it comes from ({how})")
    return {str(k): str(v) for k, v in sources.items()}
