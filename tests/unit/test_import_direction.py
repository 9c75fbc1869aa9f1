"""Imports run one way.

- The services never import the load generator (speckv.loadgen): operators
  deploy them without it.
- Domain cores import neither grpc nor protobuf (speckv.v1, google.protobuf),
  directly or through another speckv module: the simulator runs them without
  a network, and proto conversion belongs to the servicers. A services module
  is a core unless ADAPTERS names it.
- Inside loadgen the packages are layered (LOADGEN_LAYERS): a package imports
  only packages of lower layers; sim and bench, one layer, do not import each
  other.

Imports under `if TYPE_CHECKING:` are annotations, not arrows, and are skipped.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.repo import REPO_ROOT

ROOTS = {"services": "speckv.services", "loadgen": "speckv.loadgen", "kernels": "speckv.kernels"}
PROTOBUF = ("grpc", "speckv.v1", "google.protobuf")
# Modules that speak gRPC or protobuf on purpose: servicers, servers, clients,
# process set-up and the tools that drive processes.
ADAPTERS = {
    "speckv.services.cli",
    # The routing client a router embeds: its Route caller and its predictor reports (its core: breaker, fallback).
    "speckv.services.client.replica_set",
    "speckv.services.client.reports",
    "speckv.services.client.routing",
    "speckv.services.cluster.*",
    # gRPC plumbing by kind: the server, interceptor, TLS, authz, telemetry, proto conversion.
    "speckv.services.common.rpc.*",
    # vLLM's KV connector: the connector class and its kvstore client (its halves use a port).
    "speckv.services.engine.vllm_connector.connector",
    "speckv.services.engine.vllm_connector.kvstore_client",
    "speckv.services.engine.vllm_connector.shared_client",
    "speckv.services.kvstore.agent",
    "speckv.services.kvstore.scheduler_link",
    "speckv.services.kvstore.config",
    "speckv.services.kvstore.grpc_target",
    "speckv.services.kvstore.nixl.target",
    "speckv.services.kvstore.server",
    "speckv.services.kvstore.servicer",
    "speckv.services.kvstore.dataplane.tcp_target",
    "speckv.services.kvstore.shm_target",
    "speckv.services.kvstore.shm_proto",
    "speckv.services.predictor.config",
    "speckv.services.predictor.server",
    "speckv.services.predictor.servicer",
    "speckv.services.scheduler.adapters.*",
}
LOADGEN_LAYERS = [("workload", "profiles"), ("engines",), ("experiments",), ("sim", "bench"), ("demo_verdict",),
                  ("demo",)]


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO_ROOT)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([ROOTS[parts[0]], *parts[1:]])


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(source: str, modules: set[str]) -> set[str]:
    """Absolute names a module imports; `from pkg import mod` yields pkg.mod
    when that is a module of the tree."""
    tree = ast.parse(source)
    skipped = _type_checking_lines(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = [p for root in ROOTS for p in (REPO_ROOT / root).rglob("*.py") if "__pycache__" not in p.parts]
    names = {module_name(p): p for p in paths}
    return {name: imports_of(path.read_text(), set(names)) for name, path in names.items()}


def _matches(name: str, patterns: set[str]) -> bool:
    return any(name == p or (p.endswith(".*") and name.startswith(p[:-1])) for p in patterns)


def _is(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def import_chain(graph: dict[str, set[str]], start: str, prefixes: tuple[str, ...]) -> list[str] | None:
    """A shortest chain of imports from start to a module under one of
    prefixes (itself or a sub-module), or None."""
    parents: dict[str, str | None] = {start: None}
    queue = [start]
    while queue:
        current = queue.pop(0)
        for target in sorted(graph.get(current, ())):
            if any(_is(target, p) for p in prefixes):
                chain = [target, current]
                while parents[chain[-1]] is not None:
                    chain.append(parents[chain[-1]])  # type: ignore[arg-type]
                return chain[::-1]
            if target in graph and target not in parents:
                parents[target] = current
                queue.append(target)
    return None


def protobuf_path(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A chain of imports from start to grpc/protobuf, or None."""
    return import_chain(graph, start, PROTOBUF)


def _layer(name: str) -> int | None:
    rest = name.removeprefix("speckv.loadgen.").split(".")[0]
    return next((i for i, layer in enumerate(LOADGEN_LAYERS) if rest in layer), None)


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        if _is(module, "speckv.services") or _is(module, "speckv.kernels"):
            found += [f"{module} imports the load generator ({t})" for t in sorted(targets) if _is(t, "speckv.loadgen")]
        if _is(module, "speckv.services") and not _matches(module, ADAPTERS):
            chain = protobuf_path(graph, module)
            if chain:
                found.append(f"core {module} reaches gRPC/protobuf: {' -> '.join(chain)}")
        if _is(module, "speckv.loadgen") and (mine := _layer(module)) is not None:
            for t in sorted(targets):
                theirs = _layer(t) if _is(t, "speckv.loadgen") else None
                same_package = t.split(".")[2:3] == module.split(".")[2:3]
                if theirs is not None and not same_package and theirs >= mine:
                    found.append(f"{module} (layer {mine}) imports {t} (layer {theirs})")
    return found


def test_imports_run_one_way():
    assert violations(import_graph()) == []


def test_every_adapter_exists():
    graph = import_graph()
    missing = [a for a in ADAPTERS if not any(_matches(m, {a}) for m in graph)]
    assert missing == []


@pytest.mark.parametrize("module, planted, expected", [
    ("speckv.services.scheduler.adapters.config", "speckv.loadgen.workload.replay", "imports the load generator"),
    ("speckv.services.kvstore.store", "speckv.v1.kvstore_pb2", "reaches gRPC/protobuf"),
    ("speckv.services.common.geometry", "grpc", "reaches gRPC/protobuf"),
    ("speckv.services.common.ids", "speckv.services.scheduler.adapters.servicer", "reaches gRPC/protobuf"),
    ("speckv.loadgen.workload.replay", "speckv.loadgen.sim.simulation", "layer"),
    ("speckv.loadgen.sim.cli", "speckv.loadgen.bench.e2e.cli", "layer"),
])
def test_a_planted_wrong_way_import_is_caught(module, planted, expected):
    graph = import_graph()
    graph[module] = graph[module] | {planted}
    assert any(expected in v and module in v for v in violations(graph)), violations(graph)
