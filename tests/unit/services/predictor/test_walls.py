"""Walls inside the predictor.

- serving (what a running predictor needs to answer Forecast and
  ForecastReturns) imports neither fitting nor judging, directly or through
  any other speckv module: a predictor serves without its training code.
- judging (metrics, the benches' reference forecasters) does not import
  fitting: fitting chooses by the judges' metrics, never the other way.
- No import loop: tests/unit/test_import_loops.py, for every package.

Imports inside functions count (a lazy import is still an arrow); imports
under `if TYPE_CHECKING:` are annotations and are skipped (the graph of
tests/unit/test_import_direction.py).
"""
from __future__ import annotations

import pytest

from tests.unit.test_import_direction import _is, import_chain, import_graph

PREDICTOR = "speckv.services.predictor"
SERVING, FITTING, JUDGING = f"{PREDICTOR}.serving", f"{PREDICTOR}.fitting", f"{PREDICTOR}.judging"
WALLS = [(SERVING, (FITTING, JUDGING)), (JUDGING, (FITTING,))]


def breaches(graph: dict[str, set[str]], inner: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """Each module under inner that reaches a forbidden package, with its chain."""
    found = {}
    for name in sorted(graph):
        if _is(name, inner):
            chain = import_chain(graph, name, forbidden)
            if chain is not None:
                found[name] = chain
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


@pytest.mark.parametrize(("inner", "forbidden"), WALLS)
def test_the_walls_hold(graph, inner, forbidden):
    found = breaches(graph, inner, forbidden)
    assert not found, "\n".join(" -> ".join(chain) for chain in found.values())


def test_every_role_exists(graph):
    for package in (SERVING, FITTING, JUDGING):
        assert package in graph


@pytest.mark.parametrize(("planted", "via"), [
    ({f"{SERVING}.core": {f"{FITTING}.training"}}, "direct"),
    ({f"{SERVING}.manifest": {"speckv.services.common.errors"},
      "speckv.services.common.errors": {f"{JUDGING}.evaluation"}}, "through another speckv module"),
    ({f"{SERVING}.returns.tracker": {f"{PREDICTOR}.server"}}, "through the adapters"),
])
def test_a_planted_breach_is_caught(graph, planted, via):
    wrong = {name: set(targets) for name, targets in graph.items()}
    for name, targets in planted.items():
        wrong[name] |= targets
    assert breaches(wrong, SERVING, (FITTING, JUDGING)), via
