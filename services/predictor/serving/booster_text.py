"""A served LightGBM booster file, checked before LightGBM sees it.

Why: LightGBM parses a text model without checking that its trees are
trees. A child index past the node arrays, a split feature past the
feature count or a child that points back up is accepted at load and read
out of bounds (or looped over forever) only when a row walks to that node,
so a crafted booster can pass the reload probe (sandbox.py: 16 dummy rows
walk some paths, not all) and then kill or wedge the server at a later
Forecast (found by `speckv bench predictor --crafted`: a split_feature of
2**31-1 deep in one tree, SIGSEGV in the predictor). Every path is
therefore checked here, in the probe and in the server alike, and LightGBM
is given the checked text, never the file again.

Invariants of a text `checked_model_text` returns (it raises ValueError,
naming the tree and key, otherwise):
- the header has max_feature_idx = num_features - 1, num_class = 1 and
  num_tree_per_iteration = 1 (a served booster is one output), and no key
  twice;
- every tree: 1 <= num_leaves <= MAX_LEAVES; no key twice, no blank line
  inside; num_cat = 0 and no categorical decision type, is_linear absent or
  0 (the trainer writes neither; compiled_trees.py refuses them too);
  split_feature, threshold, decision_type, left_child and right_child hold
  num_leaves - 1 entries and leaf_value num_leaves; split_feature in
  [0, max_feature_idx]; decision_type's missing type 0, 1 or 2;
  thresholds not NaN (an infinite one is LightGBM's own); leaf values and
  shrinkage finite;
- from the root, every internal node and every leaf is reached exactly once
  (so no index leaves the arrays and no walk loops);
- the returned text is the header without tree_sizes, the checked blocks
  and the rest as read: without tree_sizes LightGBM parses the trees one
  after the other, as they were split here, and never at offsets the file
  claims.
"""
from __future__ import annotations

import math

MAX_LEAVES = 131_072  # LightGBM's own limit on num_leaves
MAX_BOOSTER_BYTES = 128 << 20  # the trainer's boosters are a few hundred KB
END_OF_TREES = "end of trees"
_NODE_KEYS = ("split_feature", "threshold", "decision_type", "left_child", "right_child")
_CATEGORICAL_MASK = 1


def checked_model_text(data: bytes, num_features: int) -> str:
    """The text LightGBM is to load from `data` (a booster file), checked as
    the module docstring says; ValueError naming what is wrong otherwise."""
    if len(data) > MAX_BOOSTER_BYTES:
        raise ValueError(f"{len(data)} bytes, at most {MAX_BOOSTER_BYTES}")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not a LightGBM text model (byte {exc.start} is not ASCII)") from None
    lines = text.split("\n")
    first_tree = next((i for i, line in enumerate(lines) if line.startswith("Tree=")), None)
    end = next((i for i, line in enumerate(lines) if line == END_OF_TREES), None)
    if first_tree is None or end is None or end < first_tree:
        raise ValueError(f"not a LightGBM text model (no Tree= blocks before {END_OF_TREES!r})")
    header = _header(lines[:first_tree], num_features)
    blocks: list[list[str]] = []
    for line in lines[first_tree:end]:
        if line.startswith("Tree="):
            blocks.append([line])
        else:
            blocks[-1].append(line)
    out = [line for line in lines[:first_tree] if not line.startswith("tree_sizes=")]
    for i, block in enumerate(blocks):
        body = _strip_blank_tail(block[1:])
        if block[0] != f"Tree={i}":
            raise ValueError(f"tree {i}: starts with {block[0][:40]!r}")
        _check_tree(i, body, header)
        out += [block[0], *body, "", ""]
    return "\n".join([*out, *lines[end:]])


def _strip_blank_tail(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _key_values(lines: list[str], where: str, flags: bool = False) -> dict[str, str]:
    """key=value lines as a dict; with flags, a bare key (the header's
    average_output) reads as an empty value."""
    out: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep and not flags:
            raise ValueError(f"{where}: line {line[:40]!r} is not key=value")
        if key in out:
            raise ValueError(f"{where}: {key} given twice")
        out[key] = value
    return out


def _header(lines: list[str], num_features: int) -> dict[str, str]:
    body = [line for line in lines if line.strip()]
    if not body or body[0] != "tree":
        raise ValueError("not a LightGBM text model (no 'tree' line first)")
    header = _key_values(body[1:], "header", flags=True)
    for key, want in (("max_feature_idx", num_features - 1), ("num_class", 1), ("num_tree_per_iteration", 1)):
        got = _int(header, key, "header")
        if got != want:
            raise ValueError(f"header: {key}={got}, a served booster has {want}")
    return header


def _int(values: dict[str, str], key: str, where: str) -> int:
    if key not in values:
        raise ValueError(f"{where}: no {key}")
    try:
        return int(values[key])
    except ValueError:
        raise ValueError(f"{where}: {key}={values[key][:40]!r} is not an integer") from None


def _ints(values: dict[str, str], key: str, count: int, where: str) -> list[int]:
    parts = values.get(key, "").split(" ") if count else []
    if len(parts) != count:
        raise ValueError(f"{where}: {key} holds {len(parts)} entries, num_leaves says {count}")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{where}: {key} holds a value that is not an integer") from None


def _floats(values: dict[str, str], key: str, count: int, where: str) -> list[float]:
    parts = values.get(key, "").split(" ") if count else []
    if len(parts) != count:
        raise ValueError(f"{where}: {key} holds {len(parts)} entries, num_leaves says {count}")
    try:
        return [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"{where}: {key} holds a value that is not a number") from None


def _check_tree(i: int, body: list[str], header: dict[str, str]) -> None:
    where = f"tree {i}"
    if any(not line.strip() for line in body):
        raise ValueError(f"{where}: a blank line inside the tree")
    values = _key_values(body, where)
    leaves = _int(values, "num_leaves", where)
    if not 1 <= leaves <= MAX_LEAVES:
        raise ValueError(f"{where}: num_leaves={leaves}, must be in [1, {MAX_LEAVES}]")
    if _int(values, "num_cat", where) != 0:
        raise ValueError(f"{where}: categorical splits are not served")
    if values.get("is_linear", "0") != "0":
        raise ValueError(f"{where}: linear trees are not served")
    shrinkage = _floats(values, "shrinkage", 1, where) if "shrinkage" in values else [1.0]
    leaf_values = _floats(values, "leaf_value", leaves, where)
    if not all(math.isfinite(v) for v in (*leaf_values, *shrinkage)):
        raise ValueError(f"{where}: a leaf value or the shrinkage is not finite")
    if leaves == 1:
        return
    internal = leaves - 1
    features = _ints(values, "split_feature", internal, where)
    top = int(header["max_feature_idx"])
    if not all(0 <= f <= top for f in features):
        raise ValueError(f"{where}: a split_feature is outside [0, {top}]")
    if any(math.isnan(t) for t in _floats(values, "threshold", internal, where)):
        raise ValueError(f"{where}: a threshold is NaN")
    for d in _ints(values, "decision_type", internal, where):
        if not 0 <= d < 16 or d & _CATEGORICAL_MASK or (d >> 2) & 3 == 3:
            raise ValueError(f"{where}: decision_type={d} is not a numerical split LightGBM writes")
    left, right = _ints(values, "left_child", internal, where), _ints(values, "right_child", internal, where)
    _check_shape(where, left, right, leaves)


def _check_shape(where: str, left: list[int], right: list[int], leaves: int) -> None:
    """From node 0, every internal node (index >= 0) and every leaf (~index)
    is reached exactly once."""
    seen_nodes = [False] * (leaves - 1)
    seen_leaves = [False] * leaves
    seen_nodes[0] = True
    stack = [0]
    while stack:
        node = stack.pop()
        for child in (left[node], right[node]):
            if child >= 0:
                if child >= leaves - 1 or seen_nodes[child]:
                    raise ValueError(f"{where}: node {node} has child {child}, outside the tree or reached twice")
                seen_nodes[child] = True
                stack.append(child)
            else:
                leaf = ~child
                if leaf >= leaves or seen_leaves[leaf]:
                    raise ValueError(f"{where}: node {node} has leaf {leaf}, outside the tree or reached twice")
                seen_leaves[leaf] = True
    if not all(seen_nodes) or not all(seen_leaves):
        raise ValueError(f"{where}: some nodes or leaves are not reached from the root")
