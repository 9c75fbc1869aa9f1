"""Walls inside the predictor.

- serving (what a running predictor needs to answer Forecast and
  ForecastReturns) imports neither fitting nor judging, directly or through
  any other speckv module: a predictor serves without its training code.
- judging (metrics, the benches' reference forecasters) does not import
  fitting: fitting chooses by the judges' metrics, never the other way.
- No import loop among the predictor's modules, nor among the kernels'.

Imports inside functions count (a lazy import is still an arrow); imports
under `if TYPE_CHECKING:` are annotations and are skipped (the graph of
tests/unit/test_import_direction.py).
"""
from __future__ import annotations

import pytest

from tests.unit.test_import_direction import _is, import_graph

PREDICTOR = "speckv.services.predictor"
SERVING, FITTING, JUDGING = f"{PREDICTOR}.serving", f"{PREDICTOR}.fitting", f"{PREDICTOR}.judging"
WALLS = [(SERVING, (FITTING, JUDGING)), (JUDGING, (FITTING,))]
LOOP_FREE = (PREDICTOR, "speckv.kernels")


def forbidden_path(graph: dict[str, set[str]], start: str, forbidden: tuple[str, ...]) -> list[str] | None:
    """A chain of imports from start to a module under one of forbidden, or None."""
    parents: dict[str, str | None] = {start: None}
    queue = [start]
    while queue:
        current = queue.pop(0)
        for target in sorted(graph.get(current, ())):
            if any(_is(target, f) for f in forbidden):
                chain = [target, current]
                while parents[chain[-1]] is not None:
                    chain.append(parents[chain[-1]])  # type: ignore[arg-type]
                return chain[::-1]
            if target in graph and target not in parents:
                parents[target] = current
                queue.append(target)
    return None


def breaches(graph: dict[str, set[str]], inner: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """Each module under inner that reaches a forbidden package, with its chain."""
    found = {}
    for name in sorted(graph):
        if _is(name, inner):
            chain = forbidden_path(graph, name, forbidden)
            if chain is not None:
                found[name] = chain
    return found


def loops(graph: dict[str, set[str]], prefix: str) -> list[list[str]]:
    """Import loops among the modules under prefix (one per strongly
    connected component of more than one module, or a module importing itself)."""
    nodes = sorted(n for n in graph if _is(n, prefix))
    edges = {n: sorted(t for t in graph[n] if t in graph and _is(t, prefix)) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges[node]:
                found.append(sorted(component))

    for node in nodes:
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


@pytest.mark.parametrize(("inner", "forbidden"), WALLS)
def test_the_walls_hold(graph, inner, forbidden):
    found = breaches(graph, inner, forbidden)
    assert not found, "\n".join(" -> ".join(chain) for chain in found.values())


@pytest.mark.parametrize("prefix", LOOP_FREE)
def test_no_import_loops(graph, prefix):
    assert loops(graph, prefix) == []


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


def test_a_planted_loop_is_caught(graph):
    wrong = {name: set(targets) for name, targets in graph.items()}
    wrong[f"{SERVING}.poisson"].add(f"{SERVING}.negbin")  # negbin imports poisson
    assert loops(wrong, PREDICTOR) == [[f"{SERVING}.negbin", f"{SERVING}.poisson"]]
