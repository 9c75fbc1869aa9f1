"""How a model directory is damaged for the crafted-directories bench
(crafted.py) and the predictor's hardening tests: its manifest read,
rewritten and resealed, a booster's tree text edited, whole copies crashing,
cut short, garbled or with a manifest changed. Files only: no process, no
service.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

from speckv.services.predictor.serving.manifest import MANIFEST_NAME


def read_manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))


def write_manifest(directory: Path, manifest: Any) -> None:
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def reseal(directory: Path, library: str) -> None:
    """Rewrites the manifest's SHA-256 of library to the file's own: the
    damage then reaches the loader instead of the checksum."""
    manifest = read_manifest(directory)
    manifest["compiled"]["sha256"][library] = _sha256(directory / library)
    write_manifest(directory, manifest)


_TREE = re.compile(r"^Tree=\d+\n.*?(?=^Tree=|^end of trees)", re.M | re.S)


def tree_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every Tree= block of a LightGBM text model."""
    return [m.span() for m in _TREE.finditer(text)]


def drop_tree_sizes(text: str) -> str:
    """Without its tree_sizes line LightGBM parses the trees one after the
    other, so an edit that changes a block's length still reaches the tree
    parser (with it, the recorded sizes would no longer match)."""
    return re.sub(r"^tree_sizes=.*\n", "", text, count=1, flags=re.M)


def random_tree(text: str, rng: random.Random) -> tuple[int, int, int, str, int]:
    """A tree of the booster text drawn by rng: (its index, its block's start
    and end offsets in text, the block, its num_leaves)."""
    spans = tree_spans(text)
    tree = rng.randrange(len(spans))
    start, end = spans[tree]
    block = text[start:end]
    leaves = int(re.search(r"^num_leaves=(\d+)$", block, re.M).group(1))  # type: ignore[union-attr]
    return tree, start, end, block, leaves


def edit_node(text: str, rng: random.Random, key: str, value: Callable[[int, int], str]) -> tuple[str, str]:
    """The text with one entry of `key` (a per-node line such as left_child)
    in a random tree replaced by value(num_leaves, entry index); and where."""
    tree, start, end, block, leaves = random_tree(text, rng)
    line = re.search(rf"^{key}=(.*)$", block, re.M)
    if line is None:
        raise ValueError(f"tree {tree} has no {key} line")
    values = line.group(1).split(" ")
    j = rng.randrange(len(values))
    values[j] = value(leaves, j)
    block = block[:line.start(1)] + " ".join(values) + block[line.end(1):]
    return drop_tree_sizes(text[:start] + block + text[end:]), f"tree {tree}, {key}[{j}]={values[j]}"


def crashing_copy(model_dir: Path, target: Path) -> Path:
    """A copy of model_dir whose first booster's first tree points at child
    node 1,000,000: LightGBM parses it and aborts the process when it walks
    the tree (SIGABRT, 'terminate called without an active exception')."""
    shutil.copytree(model_dir, target)
    booster = target / read_manifest(target)["files"]["count"][0]
    text, replaced = re.subn(r"left_child=-?\d+", "left_child=1000000", booster.read_text(), count=1)
    if replaced != 1:
        raise ValueError(f"{booster}: no left_child line")
    booster.write_text(text)
    return target


def manifest_variant(model_dir: Path, target: Path, **changes: Any) -> Path:
    """A copy of model_dir with top-level manifest keys replaced."""
    shutil.copytree(model_dir, target)
    write_manifest(target, {**read_manifest(target), **changes})
    return target


def deep_manifest(target: Path, depth: int = 100_000) -> Path:
    """A directory whose manifest is `depth` nested JSON lists."""
    target.mkdir()
    (target / MANIFEST_NAME).write_text("[" * depth + "]" * depth, encoding="utf-8")
    return target


def truncated_copy(model_dir: Path, target: Path, keep_chars: int = 200) -> Path:
    """A copy of model_dir whose first count booster keeps its first keep_chars characters."""
    shutil.copytree(model_dir, target)
    booster = target / read_manifest(target)["files"]["count"][0]
    booster.write_text(booster.read_text()[:keep_chars])
    return target


def garbage_copy(model_dir: Path, target: Path) -> Path:
    """A copy of model_dir whose first count booster is garbage bytes."""
    shutil.copytree(model_dir, target)
    (target / read_manifest(target)["files"]["count"][0]).write_bytes(b"\xff\xfe tree garbage \x00" * 50)
    return target
