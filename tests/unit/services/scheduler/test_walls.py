"""The scheduler's inner walls, read from the source (an AST walk: lazy
imports inside functions count; `if TYPE_CHECKING:` imports are annotations
and are skipped, as in tests/unit/test_import_direction.py).

- policies/ and replication/ do not import each other both ways: the views
  both read live in views.py, and replication imports no policies module
  (policies use the planner, budgets and orders of replication).
- The core (every scheduler module outside adapters/) imports no adapter
  module: the adapters wrap the core, never the other way.
- No import loop: tests/unit/test_import_loops.py, for every package.
"""
from __future__ import annotations

import pytest

from tests.unit.test_import_direction import import_graph

SCHED = "speckv.services.scheduler"
POLICIES, REPLICATION, ADAPTERS = f"{SCHED}.policies", f"{SCHED}.replication", f"{SCHED}.adapters"


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def scheduler_graph() -> dict[str, set[str]]:
    return {m: {t for t in targets if _in(t, SCHED)} for m, targets in import_graph().items() if _in(m, SCHED)}


def wall_breaches(graph: dict[str, set[str]]) -> list[str]:
    found = []
    arrows = {(a, b): (m, t) for m, targets in graph.items() for t in targets
              for a, b in ((POLICIES, REPLICATION), (REPLICATION, POLICIES)) if _in(m, a) and _in(t, b)}
    if (POLICIES, REPLICATION) in arrows and (REPLICATION, POLICIES) in arrows:
        found.append(f"policies and replication import each other: {arrows[(POLICIES, REPLICATION)]} "
                     f"and {arrows[(REPLICATION, POLICIES)]}")
    if (REPLICATION, POLICIES) in arrows:
        found.append(f"replication imports policies: {arrows[(REPLICATION, POLICIES)]}")
    for module, targets in sorted(graph.items()):
        if not _in(module, ADAPTERS):
            found += [f"core {module} imports adapter {t}" for t in sorted(targets) if _in(t, ADAPTERS)]
    return found


def test_the_walls_hold():
    assert wall_breaches(scheduler_graph()) == []


@pytest.mark.parametrize("module, planted, expected", [
    (f"{REPLICATION}.planner", f"{POLICIES}.placement", "replication imports policies"),
    (f"{SCHED}.core", f"{ADAPTERS}.state_store", "imports adapter"),
    (f"{SCHED}.views", f"{ADAPTERS}.vllm_decode", "imports adapter"),
])
def test_a_planted_breach_is_caught(module, planted, expected):
    graph = scheduler_graph()
    graph[module] = graph[module] | {planted}
    assert any(expected in v for v in wall_breaches(graph)), wall_breaches(graph)
