"""The NIXL import: tried once, its failure said in one line."""
from __future__ import annotations

import logging
import types

from speckv.services.kvstore.nixl.loader import MODULES, NixlLoader


def test_a_missing_nixl_is_none_and_said_once(caplog):
    tried = []

    def importer(name: str) -> types.ModuleType:
        tried.append(name)
        raise ImportError(f"No module named {name!r}")

    loader = NixlLoader(importer)
    with caplog.at_level(logging.WARNING):
        assert loader.api() is None and loader.api() is None and loader.api(disabled=True) is None
    assert tried == list(MODULES)  # tried once, every candidate
    lines = [r.getMessage() for r in caplog.records if "NIXL unavailable" in r.getMessage()]
    assert len(lines) == 1 and "No module named 'nixl._api'" in lines[0] and "tcp" in lines[0]


def test_the_first_module_with_an_agent_serves():
    api = types.SimpleNamespace(nixl_agent=object)
    modules = {MODULES[0]: types.SimpleNamespace(), MODULES[1]: api}  # the meta package without an agent: skipped
    assert NixlLoader(lambda name: modules[name]).api() is api  # type: ignore[arg-type]


def test_disabled_is_none_even_when_installed(caplog):
    loader = NixlLoader(lambda name: types.SimpleNamespace(nixl_agent=object))  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO):
        assert loader.api(disabled=True) is None
    assert any("--nixl not given" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
