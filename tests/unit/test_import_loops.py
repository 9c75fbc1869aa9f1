"""No import loops: not between modules, not between the parts of a package.

A loop between modules makes import order decide what works; a loop between
two sub-packages (or a sub-package and a sibling module) means neither can be
read, tested or moved without the other, which is the wall issue 40 asks for.
The graph is tests/unit/test_import_direction.py's: every speckv module under
services/, loadgen/ and kernels/, imports inside functions counted (a lazy
import is still an arrow), `if TYPE_CHECKING:` imports skipped.
"""
from __future__ import annotations

import pytest

from tests.unit.test_import_direction import import_graph

Graph = dict[str, set[str]]


def strongly_connected(nodes: list[str], edges: Graph) -> list[list[str]]:
    """Tarjan's components (iterative), each with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def module_loops(graph: Graph) -> list[list[str]]:
    edges = {m: {t for t in targets if t in graph} for m, targets in graph.items()}
    return strongly_connected(sorted(graph), edges)


def part_loops(graph: Graph) -> list[str]:
    """Per package, its direct parts (sub-packages and modules) as nodes; an
    arrow where any module of one part imports any module of another."""
    packages = {m.rsplit(".", 1)[0] for m in graph if "." in m} & set(graph)
    loops = []
    for package in sorted(packages):
        prefix = package + "."

        def part(name: str) -> str:
            return prefix + name[len(prefix):].split(".")[0]

        edges: Graph = {}
        for module, targets in graph.items():
            if not module.startswith(prefix):
                continue
            for target in targets:
                if target.startswith(prefix) and part(target) != part(module):
                    edges.setdefault(part(module), set()).add(part(target))
        for component in strongly_connected(sorted(edges), edges):
            loops.append(f"{package}: " + " <-> ".join(c[len(prefix):] for c in component))
    return loops


def test_no_module_imports_itself_round_a_loop():
    assert module_loops(import_graph()) == []


def test_no_package_has_parts_that_import_each_other():
    assert part_loops(import_graph()) == []


@pytest.mark.parametrize("module, planted", [
    ("speckv.services.common.ids", "speckv.services.common.geometry"),
    ("speckv.services.kvstore.index", "speckv.services.kvstore.store"),
])
def test_a_planted_loop_is_caught(module, planted):
    graph = import_graph()
    graph[planted] = graph[planted] | {module}
    graph[module] = graph[module] | {planted}
    assert any(module in loop and planted in loop for loop in module_loops(graph))


def test_a_planted_part_loop_is_caught():
    graph = import_graph()
    graph["speckv.services.scheduler.routing.router"] |= {"speckv.services.scheduler.replication.planner"}
    graph["speckv.services.scheduler.replication.planner"] |= {"speckv.services.scheduler.routing.router"}
    assert any("routing" in loop and "replication" in loop for loop in part_loops(graph))
