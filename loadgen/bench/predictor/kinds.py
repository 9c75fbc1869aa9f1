"""The crafted directories of `speckv bench predictor --crafted N`, one
builder per mutation kind (KINDS), each deriving a directory from the good
model under the root with a variant drawn from its random.Random; craft(i)
picks directory i's kind and variant (crafted.py runs them against a live
predictor).
"""
from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from speckv.loadgen.bench.predictor.damage import (
    drop_tree_sizes,
    edit_node,
    random_tree,
    read_manifest,
    reseal,
    tree_spans,
    write_manifest,
)
from speckv.services.predictor.serving.manifest import MANIFEST_NAME

HUGE_BYTES = 20 << 20  # the huge booster's size cap
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
    manifest = read_manifest(target)
    path = rng.choice(sorted(_paths(manifest), key=repr))
    what, value = rng.choice(_WRONG_VALUES)
    holder = manifest
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    write_manifest(target, manifest)
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
    manifest = read_manifest(target)
    size = int(variant.split()[1])
    if variant.startswith("library") and ctx.libraries():
        manifest["compiled"]["files"]["count"][0] = "c" * (size - 3) + ".so"
    else:
        manifest["files"]["count"][0] = "c" * (size - 4) + ".txt"
    write_manifest(target, manifest)
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
        reseal(target, library)
    manifest = read_manifest(target)
    if variant == "library version changed":
        manifest["compiled"]["library"] = "tl2cgen 0.0.1, treelite 0.0.1"
    elif variant == "checksum a list":
        manifest["compiled"]["sha256"][library] = [manifest["compiled"]["sha256"][library]]
    write_manifest(target, manifest)
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
        reseal(target, library)
    if variant == "entries rotated":  # names point at each other's files; each checksum matches its file
        manifest = read_manifest(target)
        names = manifest["compiled"]["files"][kind]
        manifest["compiled"]["files"][kind] = names[1:] + names[:1]
        write_manifest(target, manifest)
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
