"""`speckv bench predictor --crafted N`: N crafted model directories offered
to a live predictor by ReloadModel (issue 22, item 5: "100 crafted model
directories: 0 predictor deaths, 0 INTERNAL").

One small LightGBM model is trained on planted counts (_predictor_planted.py,
quick rounds, with its compiled trees where this host builds them), a second
one (another seed) beside it as "another model" for the swapped libraries.
A real `speckv predictor` process is started on loopback (plaintext, so the
caller is the admin) with the good model as --model-dir and a temporary
model root, and fed PLANTED_FEED_S of planted arrivals. Then, one at a time,
directory i is derived from the good model under the root, with the mutation
kind KINDS[i % len(KINDS)] and a variant drawn from random.Random(f"{seed}:{i}")
(so a run is the same for a seed, and directory i is the same whatever N),
offered by name, and removed again. After every reload the service is
checked: the process still runs, GetModelInfo answers and still names the
good model, and a Forecast of three families answers with finite values
from the good model's version.

Counted per kind: the reload's status codes, deaths (the process gone, or
a check answered UNAVAILABLE), wedges (a check that does not answer within
CHECK_TIMEOUT_S; the process is then restarted, as after a death), INTERNAL
codes (of the reload, or of a check after it), and reloads that succeeded. A success is listed with what serves
after it (GetModelInfo's `inference`) and whether its forecast is finite;
the good model is then reloaded, so the next directory is judged against
it. A success is expected where a compiled library is damaged (the model
falls back to LightGBM's predict, the same outputs) and where the damage
leaves a booster LightGBM reads as a valid model; each is named in the
report, so a reader judges it.

The target counts deaths, wedges and INTERNAL: all three must be 0. Whether
a crafted directory is refused with INVALID_ARGUMENT or FAILED_PRECONDITION
is the service's choice (docs/predictor.md, "Reload by name").

The builders are also what tests/services/test_predictor_hardening.py makes
its crafted directories with.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc

from speckv.loadgen.bench._predictor_planted import planted_arrivals, save_planted_model
from speckv.loadgen.bench._transfer_procs import _read_address
from speckv.services.cluster.parent_death import child_environ
from speckv.services.predictor.manifest import MANIFEST_NAME
from speckv.v1 import predictor_pb2 as pb
from speckv.v1 import predictor_pb2_grpc

HUGE_BYTES = 20 << 20  # the huge booster's size cap
PLANTED_FEED_S = 590.0  # arrivals fed at start: within the predictor's default 600 s window
FEED_SEED = 9
CHECK_FAMILIES = ("steady-a", "bursty", "never-seen")
CHECK_TIMEOUT_S = 30.0  # a check unanswered this long is a wedged predictor
PROBE_TIMEOUT_S = 60.0  # the predictor's default reload_probe_timeout_s (what operators run)
GOOD = "good"
OUTSIDE_MARKER = "speckv-outside-the-root-7f3a"  # written outside the root; never in an answer


# --- the crafted directories ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CraftContext:
    """Where crafting happens: the good model (root/GOOD), the root, a folder
    outside the root (the symlink targets, the other model) and the good
    model's manifest."""

    root: Path
    outside: Path
    good: Path
    other: Path
    manifest: dict[str, Any]

    def copy(self, name: str) -> Path:
        """A fresh copy of the good model at root/name."""
        target = self.root / name
        shutil.copytree(self.good, target)
        return target

    def boosters(self) -> list[str]:
        """Every booster file the manifest names, sorted."""
        return sorted(n for names in self.manifest["files"].values() for n in names)

    def libraries(self) -> list[str]:
        """Every compiled library the manifest names (none without compiled trees)."""
        compiled = self.manifest.get("compiled")
        if not isinstance(compiled, dict) or "files" not in compiled:
            return []
        return sorted(n for names in compiled["files"].values() for n in names)


@dataclass(frozen=True, slots=True)
class Crafted:
    """One crafted directory: its kind, what was done (the variant) and the
    name ReloadModel is given."""

    kind: str
    variant: str
    name: str


Crafter = Callable[[CraftContext, random.Random, str], Crafted]


def _read_manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))


def _write_manifest(directory: Path, manifest: Any) -> None:
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _reseal(directory: Path, library: str) -> None:
    """Rewrites the manifest's SHA-256 of library to the file's own: the
    damage then reaches the loader instead of the checksum."""
    manifest = _read_manifest(directory)
    manifest["compiled"]["sha256"][library] = _sha256(directory / library)
    _write_manifest(directory, manifest)


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
    booster = target / _read_manifest(target)["files"]["count"][0]
    text, replaced = re.subn(r"left_child=-?\d+", "left_child=1000000", booster.read_text(), count=1)
    if replaced != 1:
        raise ValueError(f"{booster}: no left_child line")
    booster.write_text(text)
    return target


def manifest_variant(model_dir: Path, target: Path, **changes: Any) -> Path:
    """A copy of model_dir with top-level manifest keys replaced."""
    shutil.copytree(model_dir, target)
    _write_manifest(target, {**_read_manifest(target), **changes})
    return target


def deep_manifest(target: Path, depth: int = 100_000) -> Path:
    """A directory whose manifest is `depth` nested JSON lists."""
    target.mkdir()
    (target / MANIFEST_NAME).write_text("[" * depth + "]" * depth, encoding="utf-8")
    return target


def truncated_copy(model_dir: Path, target: Path, keep_chars: int = 200) -> Path:
    """A copy of model_dir whose first count booster keeps its first keep_chars characters."""
    shutil.copytree(model_dir, target)
    booster = target / _read_manifest(target)["files"]["count"][0]
    booster.write_text(booster.read_text()[:keep_chars])
    return target


def garbage_copy(model_dir: Path, target: Path) -> Path:
    """A copy of model_dir whose first count booster is garbage bytes."""
    shutil.copytree(model_dir, target)
    (target / _read_manifest(target)["files"]["count"][0]).write_bytes(b"\xff\xfe tree garbage \x00" * 50)
    return target


def _booster_file(ctx: CraftContext, rng: random.Random, name: str) -> tuple[Path, Path]:
    """(a fresh copy of the good model at root/name, one of its booster files at random)."""
    target = ctx.copy(name)
    return target, target / rng.choice(ctx.boosters())


def craft_truncated(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    _, booster = _booster_file(ctx, rng, name)
    data = booster.read_bytes()
    cut = rng.randrange(1, len(data))
    booster.write_bytes(data[:cut])
    return Crafted("truncated-booster", f"{booster.name} cut at byte {cut} of {len(data)}", name)


def craft_garbage_tree(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    _, booster = _booster_file(ctx, rng, name)
    data = booster.read_bytes()
    spans = tree_spans(data.decode())  # ASCII: character offsets are byte offsets
    tree = rng.randrange(len(spans))
    start, end = spans[tree]
    length = rng.randint(1, min(200, end - start - 1))
    at = rng.randrange(start, end - length)
    # Same length, so the recorded tree_sizes still hold and LightGBM reads the garbage as part of the tree
    booster.write_bytes(data[:at] + rng.randbytes(length) + data[at + length:])
    return Crafted("garbage-tree", f"{booster.name} tree {tree}: {length} random bytes at {at}", name)


def craft_child_out_of_range(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    _, booster = _booster_file(ctx, rng, name)
    choices: list[tuple[str, Callable[[int, int], str]]] = [
        ("first internal index past the end", lambda leaves, _j: str(leaves - 1)),
        ("1000000", lambda _l, _j: "1000000"),
        ("INT32_MAX", lambda _l, _j: str(2**31 - 1)),
        ("leaf past the end", lambda leaves, _j: str(-(leaves + 1))),
        ("leaf -1000000", lambda _l, _j: "-1000000"),
        ("INT32_MIN", lambda _l, _j: str(-(2**31))),
        ("back to the root (a cycle)", lambda _l, _j: "0"),
        ("not a number", lambda _l, _j: "x1"),
    ]
    what, value = rng.choice(choices)
    text, where = edit_node(booster.read_text(), rng, rng.choice(("left_child", "right_child")), value)
    booster.write_text(text)
    return Crafted("child-out-of-range", f"{booster.name} {where} ({what})", name)


def craft_split_feature(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    _, booster = _booster_file(ctx, rng, name)
    text = booster.read_text()
    top = int(re.search(r"^max_feature_idx=(\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    what, value = rng.choice([("max_feature_idx + 1", str(top + 1)), ("1000000", "1000000"), ("-1", "-1"),
                              ("INT32_MAX", str(2**31 - 1))])
    text, where = edit_node(text, rng, "split_feature", lambda _l, _j: value)
    booster.write_text(text)
    return Crafted("split-feature-out-of-range", f"{booster.name} {where} ({what})", name)


def _edit_header(text: str, key: str, value: str) -> str:
    return re.sub(rf"^{key}=.*$", f"{key}={value}", text, count=1, flags=re.M)


def craft_wrong_counts(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    _, booster = _booster_file(ctx, rng, name)
    text = booster.read_text()
    tree, start, end, block, leaves = random_tree(text, rng)
    sizes = re.search(r"^tree_sizes=(.*)$", text, re.M)
    top = int(re.search(r"^max_feature_idx=(\d+)$", text, re.M).group(1))  # type: ignore[union-attr]

    def leaves_to(n: int) -> str:
        edited = re.sub(r"^num_leaves=\d+$", f"num_leaves={n}", block, count=1, flags=re.M)
        return drop_tree_sizes(text[:start] + edited + text[end:])

    variants: list[tuple[str, Callable[[], str]]] = [
        (f"tree {tree} num_leaves {leaves} -> {leaves + 1}", lambda: leaves_to(leaves + 1)),
        (f"tree {tree} num_leaves {leaves} -> {leaves - 1}", lambda: leaves_to(leaves - 1)),
        (f"tree {tree} num_leaves {leaves} -> 1", lambda: leaves_to(1)),
        (f"tree {tree} num_leaves {leaves} -> 0", lambda: leaves_to(0)),
        (f"tree {tree} num_leaves {leaves} -> 100000", lambda: leaves_to(100_000)),
        (f"tree {tree} removed, tree_sizes kept", lambda: text[:start] + text[end:]),
        (f"tree {tree} removed, tree_sizes dropped", lambda: drop_tree_sizes(text[:start] + text[end:])),
        ("tree_sizes one entry short", lambda: text[:sizes.start(1)] + sizes.group(1).rsplit(" ", 1)[0]
         + text[sizes.end(1):] if sizes else text),
        ("tree_sizes one entry extra", lambda: text[:sizes.start(1)] + sizes.group(1) + " 1700"
         + text[sizes.end(1):] if sizes else text),
        ("num_tree_per_iteration=2", lambda: _edit_header(text, "num_tree_per_iteration", "2")),
        ("num_class=3", lambda: _edit_header(text, "num_class", "3")),
        (f"max_feature_idx {top} -> {top - 5}", lambda: _edit_header(text, "max_feature_idx", str(top - 5))),
        (f"max_feature_idx {top} -> 1000000", lambda: _edit_header(text, "max_feature_idx", "1000000")),
    ]
    what, make = rng.choice(variants)
    booster.write_text(make())
    return Crafted("wrong-counts", f"{booster.name} {what}", name)


def craft_non_finite(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    _, booster = _booster_file(ctx, rng, name)
    key = rng.choice(("threshold", "leaf_value", "shrinkage"))
    value = rng.choice(("nan", "inf", "-inf", "1e400", "-nan"))
    text, where = edit_node(booster.read_text(), rng, key, lambda _l, _j: value)
    booster.write_text(text)
    return Crafted("non-finite-values", f"{booster.name} {where}", name)


def _nested(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def craft_deep_json(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    depth = rng.choice((990, 5_000, 100_000, 400_000))
    nest = rng.choice(("list", "object"))
    where = rng.choice(("the whole manifest", "metrics", "point", "feature_spec", "trace", "compiled"))
    if where == "the whole manifest":
        target = ctx.root / name
        target.mkdir()
        (target / MANIFEST_NAME).write_text(_nested(depth, nest), encoding="utf-8")
    else:
        target = ctx.copy(name)
        text = json.dumps({**ctx.manifest, where: "@DEEP@"})
        (target / MANIFEST_NAME).write_text(text.replace('"@DEEP@"', _nested(depth, nest)), encoding="utf-8")
    return Crafted("deep-json", f"{where}: {depth} nested {nest}s", name)


_WRONG_VALUES: tuple[tuple[str, Any], ...] = (
    ("a string", "1"), ("a list", [1]), ("an object", {}), ("null", None), ("true", True), ("-1", -1),
    ("1e308", 1e308), ("an empty list", []), ("a long string", "x" * 10_000), ("a list of nulls", [None, None]),
)


def _paths(value: Any, prefix: tuple[Any, ...] = (), depth: int = 3) -> Iterator[tuple[Any, ...]]:
    """Every key path into value down to `depth` levels (dict keys and list indices)."""
    if depth == 0:
        return
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key), depth - 1)


def craft_wrong_types(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    target = ctx.copy(name)
    manifest = _read_manifest(target)
    path = rng.choice(sorted(_paths(manifest), key=repr))
    what, value = rng.choice(_WRONG_VALUES)
    holder = manifest
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    _write_manifest(target, manifest)
    return Crafted("wrong-types", f"{'.'.join(map(str, path))} = {what}", name)


def craft_missing_file(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    target = ctx.copy(name)
    victim = rng.choice([*ctx.boosters(), *ctx.libraries(), MANIFEST_NAME])
    how = rng.choice(("removed", "a directory", "empty"))
    (target / victim).unlink()
    if how == "a directory":
        (target / victim).mkdir()
    elif how == "empty":
        (target / victim).write_bytes(b"")
    return Crafted("missing-file", f"{victim} {how}", name)


def craft_symlink_escape(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    secret = ctx.outside / "secret.txt"
    if not secret.exists():
        secret.write_text(f"{OUTSIDE_MARKER}\nnum_leaves=3\n", encoding="utf-8")
    outside_model = ctx.outside / "model"
    if not outside_model.exists():
        shutil.copytree(ctx.good, outside_model)
    link = ctx.root / name
    variant = rng.choice(("dir-absolute", "dir-relative", "dir-loop", "dir-dangling", "booster-outside-model",
                          "booster-secret", "manifest-outside", "library-outside", "booster-device"))
    if variant == "dir-absolute":
        link.symlink_to(outside_model, target_is_directory=True)
    elif variant == "dir-relative":
        link.symlink_to(Path("..") / ctx.outside.name / "model", target_is_directory=True)
    elif variant == "dir-loop":
        link.symlink_to(name)
    elif variant == "dir-dangling":
        link.symlink_to(ctx.outside / "nowhere")
    else:
        target = ctx.copy(name)
        booster = rng.choice(ctx.boosters())
        library = rng.choice(ctx.libraries() or [booster])
        file, points_to = {
            "booster-outside-model": (booster, outside_model / booster),
            "booster-secret": (booster, secret),
            "manifest-outside": (MANIFEST_NAME, outside_model / MANIFEST_NAME),
            "library-outside": (library, outside_model / library),
            "booster-device": (booster, Path("/dev/zero")),
        }[variant]
        (target / file).unlink()
        (target / file).symlink_to(points_to)
        variant = f"{variant}: {file} -> {points_to.name}"
    return Crafted("symlink-escape", variant, name)


def craft_overlong_name(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    variant = rng.choice(("name 129", "name 255", "name 256", "name 4097", "name 10000", "name non-ASCII",
                          "booster 300", "booster 5000", "library 300"))
    if variant.startswith("name"):
        size = {"129": 129, "255": 255, "256": 256, "4097": 4097, "10000": 10_000}.get(variant.split()[1], 0)
        long_name = ("n" * size if size else "é" * 100)
        if size in (129, 255):  # a real directory by that name: the name is what is refused
            shutil.copytree(ctx.good, ctx.root / long_name)
        return Crafted("overlong-name", f"request name of {len(long_name)} characters", long_name)
    target = ctx.copy(name)
    manifest = _read_manifest(target)
    size = int(variant.split()[1])
    if variant.startswith("library") and ctx.libraries():
        manifest["compiled"]["files"]["count"][0] = "c" * (size - 3) + ".so"
    else:
        manifest["files"]["count"][0] = "c" * (size - 4) + ".txt"
    _write_manifest(target, manifest)
    return Crafted("overlong-name", f"manifest names a {variant.split()[0]} file of {size} characters", name)


def craft_huge_booster(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    _, booster = _booster_file(ctx, rng, name)
    text = booster.read_text()
    variant = rng.choice(("trees repeated", "junk appended", "random bytes", "one long line", "long leaf_value"))
    if variant == "trees repeated":
        start, end = tree_spans(text)[0][0], tree_spans(text)[-1][1]
        trees = text[start:end]
        copies = max(1, (HUGE_BYTES - len(text)) // len(trees))
        data = (drop_tree_sizes(text[:start]) + trees * copies + text[end:]).encode()
    elif variant == "junk appended":
        data = text.encode() + b"junk=1 2 3\n" * ((HUGE_BYTES - len(text)) // 11)
    elif variant == "random bytes":
        data = rng.randbytes(HUGE_BYTES)
    elif variant == "one long line":
        data = b"tree\nversion=v4\nfeature_names=" + b"x " * (HUGE_BYTES // 2) + b"\n"
    else:
        start, end = tree_spans(text)[0]
        block = text[start:end]
        filler = " 0.5" * ((HUGE_BYTES - len(text)) // 4)
        block = re.sub(r"^(leaf_value=.*)$", lambda m: m.group(1) + filler, block, count=1, flags=re.M)
        data = drop_tree_sizes(text[:start] + block + text[end:]).encode()
    booster.write_bytes(data[:HUGE_BYTES])
    return Crafted("huge-booster", f"{booster.name} {variant}, {min(len(data), HUGE_BYTES) >> 20} MiB", name)


def craft_compiled_corrupt(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    target = ctx.copy(name)
    library = rng.choice(ctx.libraries())
    path = target / library
    data = bytearray(path.read_bytes())
    variant = rng.choice(("bytes flipped, checksum unchanged", "bytes flipped, checksum resealed",
                          "truncated, checksum resealed", "random bytes, checksum resealed",
                          "ELF header zeroed, checksum resealed", "library version changed",
                          "checksum a list"))
    if variant.startswith("bytes flipped"):
        for at in rng.sample(range(len(data)), 64):
            data[at] ^= 0xFF
    elif variant.startswith("truncated"):
        data = data[:rng.randrange(1, len(data))]
    elif variant.startswith("random bytes"):
        data = bytearray(rng.randbytes(len(data)))
    elif variant.startswith("ELF header"):
        data[:64] = bytes(64)
    path.write_bytes(bytes(data))
    if "resealed" in variant:
        _reseal(target, library)
    manifest = _read_manifest(target)
    if variant == "library version changed":
        manifest["compiled"]["library"] = "tl2cgen 0.0.1, treelite 0.0.1"
    elif variant == "checksum a list":
        manifest["compiled"]["sha256"][library] = [manifest["compiled"]["sha256"][library]]
    _write_manifest(target, manifest)
    return Crafted("compiled-corrupt", f"{library} {variant}", name)


def craft_compiled_swapped(ctx: CraftContext, rng: random.Random, name: str) -> Crafted:
    target = ctx.copy(name)
    library = rng.choice(ctx.libraries())
    kind, horizon = library.split("_", 1)
    others = [n for n in ctx.libraries() if n != library]
    variant = rng.choice(("another model's, resealed", "another model's, checksum unchanged",
                          "another horizon's, resealed", "another kind's, resealed", "entries rotated"))
    if variant.startswith("another model's"):
        shutil.copyfile(ctx.other / library, target / library)
    elif variant.startswith("another horizon's"):
        same_kind = [n for n in others if n.startswith(kind + "_")]
        shutil.copyfile(target / rng.choice(same_kind), target / library)
    elif variant.startswith("another kind's"):
        same_horizon = [n for n in others if n.endswith("_" + horizon)]
        shutil.copyfile(target / rng.choice(same_horizon), target / library)
    if "resealed" in variant:
        _reseal(target, library)
    if variant == "entries rotated":  # names point at each other's files; each checksum matches its file
        manifest = _read_manifest(target)
        names = manifest["compiled"]["files"][kind]
        manifest["compiled"]["files"][kind] = names[1:] + names[:1]
        _write_manifest(target, manifest)
    return Crafted("compiled-swapped", f"{library}: {variant}", name)


KINDS: dict[str, Crafter] = {
    "truncated-booster": craft_truncated,
    "garbage-tree": craft_garbage_tree,
    "child-out-of-range": craft_child_out_of_range,
    "split-feature-out-of-range": craft_split_feature,
    "wrong-counts": craft_wrong_counts,
    "non-finite-values": craft_non_finite,
    "deep-json": craft_deep_json,
    "wrong-types": craft_wrong_types,
    "missing-file": craft_missing_file,
    "symlink-escape": craft_symlink_escape,
    "overlong-name": craft_overlong_name,
    "huge-booster": craft_huge_booster,
    "compiled-corrupt": craft_compiled_corrupt,
    "compiled-swapped": craft_compiled_swapped,
}
COMPILED_KINDS = ("compiled-corrupt", "compiled-swapped")


def kinds_for(ctx: CraftContext) -> list[str]:
    """The kinds that apply to the good model (the compiled ones need compiled trees), in KINDS order."""
    return [k for k in KINDS if k not in COMPILED_KINDS or ctx.libraries()]


def craft(ctx: CraftContext, kinds: list[str], seed: int, i: int) -> Crafted:
    """Directory i of a run: kind kinds[i % len(kinds)], its variant drawn from
    random.Random(f"{seed}:{i}"), named c<i>-<kind> (or the overlong name)."""
    kind = kinds[i % len(kinds)]
    return KINDS[kind](ctx, random.Random(f"{seed}:{i}"), f"c{i:03d}-{kind}")


def remove_crafted(root: Path, name: str) -> None:
    """Removes root/name (a link, a directory or nothing); names that are not
    one path component were never created."""
    if not name or "/" in name or "\x00" in name or len(name) > 255:
        return
    path = root / name
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


# --- the predictor process ------------------------------------------------------------------------

@dataclass(slots=True)
class PredictorProcess:
    """A `speckv predictor` child on loopback (plaintext: every caller is the admin)."""

    popen: subprocess.Popen
    address: str
    log_path: Path
    channel: grpc.Channel = field(init=False)
    stub: predictor_pb2_grpc.PredictorStub = field(init=False)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.address)
        self.stub = predictor_pb2_grpc.PredictorStub(self.channel)

    def exit_reason(self) -> str:
        """"" while running; else how it ended."""
        code = self.popen.poll()
        if code is None:
            return ""
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"

    def stop(self) -> None:
        self.channel.close()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start_predictor(model_dir: Path, root: Path, log_path: Path, probe_timeout_s: float,
                    timeout_s: float = 120.0) -> PredictorProcess:
    """`python -m speckv.services.cli predictor` on 127.0.0.1:<free port>
    serving model_dir, reloading by name under root; it dies with us."""
    env = child_environ({**os.environ, "PYTHONUNBUFFERED": "1"})
    env.setdefault("SPECKV_LOG_LEVEL", "WARNING")
    argv = [sys.executable, "-m", "speckv.services.cli", "predictor", "--host", "127.0.0.1", "--port", "0",
            "--model-dir", str(model_dir), "--model-root", str(root),
            "--reload-probe-timeout-s", f"{probe_timeout_s:g}"]
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env)
    address = _read_address(popen, timeout_s)
    if address is None:
        popen.kill()
        popen.wait(timeout=30)
        raise RuntimeError(f"the predictor did not start: {log_path.read_text(errors='replace')[-2000:]}")
    process = PredictorProcess(popen, address, log_path)
    times, names = planted_arrivals(PLANTED_FEED_S, seed=FEED_SEED, start_s=time.time() - PLANTED_FEED_S)
    stream = (pb.Arrival(time_s=float(t), family=n) for t, n in zip(times, names))
    process.stub.ObserveArrivals(stream, timeout=timeout_s)
    return process


@dataclass(slots=True)
class Check:
    """The service after one reload: 'ok', or 'dead' / 'wedged' / 'unhealthy' and why."""

    state: str
    detail: str = ""
    code: str = ""  # the status code of a check that failed
    source: str = ""
    version: str = ""
    inference: str = ""
    finite: bool = True


def check_service(process: PredictorProcess) -> Check:
    """Alive, GetModelInfo and a Forecast answer, and the forecast is finite."""
    if process.exit_reason():
        return Check("dead", process.exit_reason())
    try:
        info = process.stub.GetModelInfo(pb.ModelInfoRequest(), timeout=CHECK_TIMEOUT_S)
        forecast = process.stub.Forecast(pb.ForecastRequest(families=list(CHECK_FAMILIES)), timeout=CHECK_TIMEOUT_S)
    except grpc.RpcError as exc:
        code = exc.code()
        if process.exit_reason() or code == grpc.StatusCode.UNAVAILABLE:
            return Check("dead", process.exit_reason() or f"UNAVAILABLE: {exc.details()}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return Check("wedged", f"no answer within {CHECK_TIMEOUT_S:g} s")
        return Check("unhealthy", f"{code.name}: {exc.details()}", code=code.name)
    values = [v for f in forecast.forecasts for h in f.horizons
              for v in (h.expected_count, h.upper_quantile, h.burst_probability)]
    finite = bool(values) and all(math.isfinite(v) for v in values)
    if forecast.model_version != info.version:
        return Check("unhealthy", f"Forecast from {forecast.model_version!r}, GetModelInfo says {info.version!r}")
    return Check("ok", source=os.path.realpath(info.source), version=info.version, inference=info.inference,
                 finite=finite)


# --- the run --------------------------------------------------------------------------------------

def run_crafted(n: int, seed: int, probe_timeout_s: float = PROBE_TIMEOUT_S, workdir: Path | None = None,
                echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Offers n crafted directories to a live predictor (module docstring);
    the report `speckv bench predictor --json` writes under "crafted"."""
    began = time.perf_counter()
    base = Path(tempfile.mkdtemp(prefix="speckv-crafted-", dir=workdir))
    try:
        return _run(n, seed, probe_timeout_s, base, echo, began)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(n: int, seed: int, probe_timeout_s: float, base: Path, echo: Callable[[str], None],
         began: float) -> dict[str, Any]:
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    t0 = time.perf_counter()
    good = save_planted_model(root / GOOD)
    other = save_planted_model(outside / "other", seed=2, version="lgbm-other")
    train_s = time.perf_counter() - t0
    ctx = CraftContext(root, outside, good, other, _read_manifest(good))
    kinds = kinds_for(ctx)
    good_real = os.path.realpath(good)
    echo(f"\n== crafted model directories: {n} over {len(kinds)} kinds (seed {seed}); good model trained in "
         f"{train_s:.1f} s; predictor reload probe timeout {probe_timeout_s:g} s")
    process = start_predictor(good, root, base / "predictor.log", probe_timeout_s)
    rows: list[dict[str, Any]] = []
    restarts = 0
    try:
        for i in range(n):
            crafted = craft(ctx, kinds, seed, i)
            row = _offer(process, crafted, probe_timeout_s)
            remove_crafted(root, crafted.name)
            check = check_service(process)
            row.update(service=check.state, service_detail=check.detail, check_code=check.code)
            if check.state == "ok" and row["code"] == "OK":
                row.update(accepted_inference=check.inference, accepted_finite=check.finite,
                           serving_crafted=check.source != good_real)
            elif check.state == "ok" and (check.source != good_real or not check.finite):
                row.update(service="unhealthy", service_detail=f"serving {check.source} after a refusal "
                                                               f"(finite: {check.finite})")
            if row["code"] in ("UNAVAILABLE",) or check.state in ("dead", "wedged"):
                row["log_tail"] = process.log_tail()
                process.stop()
                restarts += 1
                process = start_predictor(good, root, base / f"predictor-{restarts}.log", probe_timeout_s)
            elif row["code"] == "OK" or check.state != "ok":
                process.stub.ReloadModel(pb.ReloadModelRequest(name=GOOD), timeout=probe_timeout_s + 60)
            rows.append(row)
            echo(f"  {i:>3} {crafted.kind:<27} {row['code']:<20} {row['ms']:>7.0f} ms  {check.state:<9} "
                 f"{crafted.variant[:70]}")
    finally:
        process.stop()
    return _report(n, seed, kinds, rows, restarts, train_s, probe_timeout_s, time.perf_counter() - began)


def _offer(process: PredictorProcess, crafted: Crafted, probe_timeout_s: float) -> dict[str, Any]:
    """ReloadModel(name) once: the code, its message (cut) and the wall time."""
    t0 = time.perf_counter()
    try:
        process.stub.ReloadModel(pb.ReloadModelRequest(name=crafted.name), timeout=probe_timeout_s + 60)
        code, detail = "OK", ""
    except grpc.RpcError as exc:
        code, detail = exc.code().name, exc.details() or ""
    ms = (time.perf_counter() - t0) * 1e3
    return {"kind": crafted.kind, "variant": crafted.variant, "name": crafted.name[:80], "code": code,
            "detail": detail[:300], "leaks_outside": OUTSIDE_MARKER in detail, "ms": ms}


def _report(n: int, seed: int, kinds: list[str], rows: list[dict[str, Any]], restarts: int, train_s: float,
            probe_timeout_s: float, wall_s: float) -> dict[str, Any]:
    per_kind: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        ms = [r["ms"] for r in mine]
        per_kind[kind] = {
            "tried": len(mine), "codes": dict(Counter(r["code"] for r in mine).most_common()),
            "deaths": sum(r["service"] == "dead" or r["code"] == "UNAVAILABLE" for r in mine),
            "wedged": sum(r["service"] == "wedged" for r in mine),
            "unhealthy": sum(r["service"] == "unhealthy" for r in mine),
            "internal": sum(r["code"] == "INTERNAL" or r.get("check_code") == "INTERNAL" for r in mine),
            "accepted": sum(r["code"] == "OK" for r in mine),
            "leaks": sum(r["leaks_outside"] for r in mine),
            "ms_median": statistics.median(ms), "ms_max": max(ms)}
    totals = {key: sum(k[key] for k in per_kind.values())
              for key in ("tried", "deaths", "wedged", "unhealthy", "internal", "accepted", "leaks")}
    totals["codes"] = dict(Counter(r["code"] for r in rows).most_common())
    totals["ms_median"] = statistics.median(r["ms"] for r in rows) if rows else 0.0
    totals["ms_max"] = max((r["ms"] for r in rows), default=0.0)
    met = totals["deaths"] == 0 and totals["wedged"] == 0 and totals["internal"] == 0
    accepted = [{k: r[k] for k in ("kind", "variant", "accepted_inference", "accepted_finite") if k in r}
                for r in rows if r["code"] == "OK"]
    return {"n": n, "seed": seed, "kinds": kinds, "probe_timeout_s": probe_timeout_s, "train_s": train_s,
            "wall_s": wall_s, "restarts": restarts, "per_kind": per_kind, "totals": totals,
            "target": "0 predictor deaths, 0 INTERNAL", "target_met": met, "accepted": accepted, "reloads": rows}


def print_crafted(report: dict[str, Any]) -> None:
    """The per-kind table, the totals against the target, and every accepted directory."""
    print(f"\n{'kind':<28}{'tried':>6}{'deaths':>7}{'wedged':>7}{'INTERNAL':>9}{'accepted':>9}{'ms med':>8}"
          f"{'ms max':>8}  codes")
    rows = [*report["per_kind"].items(), ("total", report["totals"])]
    for kind, k in rows:
        codes = ", ".join(f"{c} {v}" for c, v in k["codes"].items())
        print(f"{kind:<28}{k['tried']:>6}{k['deaths']:>7}{k['wedged']:>7}{k['internal']:>9}{k['accepted']:>9}"
              f"{k['ms_median']:>8.0f}{k['ms_max']:>8.0f}  {codes}")
    t = report["totals"]
    print(f"target: {report['target']}: {'met' if report['target_met'] else 'NOT MET'} ({t['deaths']} deaths, "
          f"{t['wedged']} wedged, {t['internal']} INTERNAL, {t['unhealthy']} unhealthy after a reload, "
          f"{t['leaks']} answers echoing a file outside the root; {report['restarts']} restarts; "
          f"{report['wall_s']:.0f} s)")
    for a in report["accepted"]:
        print(f"  accepted: {a['kind']}: {a['variant']} -> finite forecast: {a.get('accepted_finite')}; "
              f"{a.get('accepted_inference', '')[:90]}")
