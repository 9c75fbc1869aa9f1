"""Explicit `__init__` methods for the dataclasses of a module, written into
the compiled build's private copy of the source (compiled.py), never into the
source itself.

Why: mypyc compiles a class's explicit `__init__` but leaves a
dataclass-generated one interpreted (mypyc/mypyc#817), several times slower
to construct, and the simulator builds records per request, per engine step
and by the hundred per scheduler tick. The source keeps plain
`@dataclass(slots=True)`; the build adds what the generated method would do.

Rule: a class decorated with `dataclass` (bare, called, or as
`dataclasses.dataclass`) gets an `__init__` when it defines none and its
decorator does not pass `init=False`. The method takes the fields in
declaration order (class-level annotated names, ClassVar and
`field(init=False)` excluded) with their annotations (the module must use
`from __future__ import annotations`, so they are never evaluated) and defaults
(`field(default=...)` included), assigns each (through
`object.__setattr__` when the decorator says `frozen=True`, as the
generated method does) and calls `__post_init__` when the class defines one.
The decorator stays, so eq, repr, order and hash are still generated, and
it keeps an `__init__` the class defines. A class this rule cannot
reproduce exactly (a `default_factory`, `kw_only`, `InitVar`, a base class
with fields) is left to the generated method: slower, never different.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InitField:
    name: str
    annotation: str
    default: str | None  # source of the default expression; None: required (or, not init: left unset)
    init: bool = True  # False: not a parameter; set to its default, as the generated method does


def add_record_inits(source: str) -> tuple[str, list[str]]:
    """(source with the explicit inits added, names of the classes that got one)."""
    tree = ast.parse(source)
    if not _postpones_annotations(tree):
        return source, []
    lines = source.splitlines(keepends=True)
    insertions: list[tuple[int, str, str]] = []  # (line after which to insert, class name, text)
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        decorator = _dataclass_decorator(node)
        if decorator is None or _keyword(decorator, "init") is False or _defines(node, "__init__"):
            continue
        fields = _init_fields(node, decorator)
        if fields is None:
            continue
        frozen = _keyword(decorator, "frozen") is True
        text = _render_init(fields, frozen, _defines(node, "__post_init__"), _body_indent(lines, node))
        insertions.append((node.end_lineno or node.lineno, node.name, text))
    for after, _, text in sorted(insertions, reverse=True):
        lines.insert(after, text)
    return "".join(lines), [name for _, name, _ in insertions]


def _postpones_annotations(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
               and any(alias.name == "annotations" for alias in node.names) for node in tree.body)


def _dataclass_decorator(node: ast.ClassDef) -> ast.expr | None:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target) in ("dataclass", "dataclasses.dataclass"):
            return decorator
    return None


def _keyword(decorator: ast.expr, name: str) -> object:
    """The decorator's constant keyword value, or None when it does not pass one."""
    if isinstance(decorator, ast.Call):
        for keyword in decorator.keywords:
            if keyword.arg == name and isinstance(keyword.value, ast.Constant):
                return keyword.value.value
    return None


def _defines(node: ast.ClassDef, name: str) -> bool:
    return any(isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == name for s in node.body)


def _init_fields(node: ast.ClassDef, decorator: ast.expr) -> list[InitField] | None:
    """The __init__ parameters, or None when the rule cannot reproduce the generated method."""
    if node.bases or node.keywords or _keyword(decorator, "kw_only") is not None:
        return None
    fields: list[InitField] = []
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        annotation = ast.unparse(statement.annotation)
        if annotation.split("[")[0] in ("ClassVar", "typing.ClassVar", "KW_ONLY", "dataclasses.KW_ONLY"):
            continue
        if annotation.split("[")[0] in ("InitVar", "dataclasses.InitVar"):
            return None
        spec = _field_spec(statement.value)
        if spec is None:
            return None
        fields.append(InitField(statement.target.id, annotation, *spec))
    return fields


def _field_spec(value: ast.expr | None) -> tuple[str | None, bool] | None:
    """(default source or None, init) of one field; None when unsupported."""
    if value is None:
        return None, True
    if not (isinstance(value, ast.Call) and ast.unparse(value.func) in ("field", "dataclasses.field")):
        return ast.unparse(value), True
    keywords = {k.arg: k.value for k in value.keywords}
    if value.args or None in keywords or "default_factory" in keywords or "kw_only" in keywords:
        return None
    init = keywords.get("init")
    if init is not None and not isinstance(init, ast.Constant):
        return None
    default = ast.unparse(keywords["default"]) if "default" in keywords else None
    return default, init is None or bool(init.value)


def _body_indent(lines: list[str], node: ast.ClassDef) -> str:
    first = lines[node.body[0].lineno - 1]
    return first[: len(first) - len(first.lstrip())]


def _render_init(fields: list[InitField], frozen: bool, post_init: bool, indent: str) -> str:
    params = ", ".join(f"{f.name}: {f.annotation}" + (f" = {f.default}" if f.default is not None else "")
                       for f in fields if f.init)
    assigned = [(f.name, f.name if f.init else f.default) for f in fields if f.init or f.default is not None]
    body = [f'object.__setattr__(self, "{name}", {value})' if frozen else f"self.{name} = {value}"
            for name, value in assigned]
    if post_init:
        body.append("self.__post_init__()")
    inner = indent * 2 if indent else "        "
    statements = "".join(f"{inner}{s}\n" for s in body) or f"{inner}pass\n"
    return f"\n{indent}def __init__(self, {params}) -> None:\n{statements}".replace("(self, )", "(self)")
