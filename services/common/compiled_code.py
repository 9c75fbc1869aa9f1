"""Whether a mypyc-compiled copy of the package may run in place of the source.

`make sim-compiled` (speckv.loadgen.sim.compiled, which builds it) writes a
full copy of the speckv package, the hot modules compiled to C extensions
beside their sources, into build/sim-compiled at the project root, with a
stamp: a SHA-256 over every source and data file of the package and the
Python and mypy versions. A copy is *current* while its stamp matches the
source it would stand in for; any edit makes it stale until rebuilt. The
simulator's workers and the scheduler (`--compiled`) run from a current copy
only, so the compiled code is always the very source in the checkout.

Here: the stamp's rules and the choice of build, with no compiler (the
services import this; the build itself is the load generator's).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Iterator

from speckv.services.common.errors import FailedPrecondition

STAMP_FILE = "STAMP.json"
MODES = ("auto", "on", "off")
_SKIPPED_DIRS = {"__pycache__"}
_SKIPPED_SUFFIXES = {".pyc", ".so", ".pyd", ".c", ".o"}


@dataclasses.dataclass(frozen=True, slots=True)
class PackageRoots:
    """Where each part of the speckv package lives on disk (the package-dir
    mapping of pyproject.toml): relative folder in the package -> source folder."""

    folders: dict[str, Path]

    @classmethod
    def of_installed(cls) -> PackageRoots:
        """Found, not imported: a service never loads the load generator (the digest still covers it)."""
        folders = {}
        for folder, name in (("", "speckv"), ("services", "speckv.services"), ("loadgen", "speckv.loadgen"),
                             ("kernels", "speckv.kernels")):
            spec = importlib.util.find_spec(name)
            if spec is None or not spec.submodule_search_locations:
                raise FailedPrecondition(f"package {name} is not installed")
            folders[folder] = Path(list(spec.submodule_search_locations)[0])
        return cls(folders)

    def files(self) -> Iterator[tuple[str, Path]]:
        """(path inside the package, source file), sorted, sources and data alike."""
        for folder, root in sorted(self.folders.items()):
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if not path.is_file() or _SKIPPED_DIRS & set(rel.parts) or path.suffix in _SKIPPED_SUFFIXES:
                    continue
                yield (f"{folder}/{rel.as_posix()}" if folder else rel.as_posix()), path


def default_dir(roots: PackageRoots) -> Path:
    """build/sim-compiled beside the loadgen folder: the project root in a checkout."""
    return roots.folders["loadgen"].parent / "build" / "sim-compiled"


def source_digest(roots: PackageRoots) -> str:
    h = hashlib.sha256()
    h.update(f"python {sys.version_info[:3]} mypy {mypy_version()}\n".encode())
    for rel, path in roots.files():
        h.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def current(tree: Path, roots: PackageRoots) -> Path | None:
    """tree, when it holds a build of exactly the present source; else None."""
    return tree if why_not_current(tree, roots) is None else None


def why_not_current(tree: Path, roots: PackageRoots) -> str | None:
    """None when tree is a current build; else why it cannot be used."""
    stamp = tree / STAMP_FILE
    if not stamp.is_file():
        return f"no compiled build in {tree} (make sim-compiled)"
    try:
        recorded = json.loads(stamp.read_text())["digest"]
    except (ValueError, KeyError, TypeError):
        return f"{stamp} is unreadable: rebuild it (make sim-compiled)"
    if recorded != source_digest(roots):
        return f"the compiled build in {tree} is older than the source (make sim-compiled)"
    return None


def choose(mode: str, folder: str | None, roots: PackageRoots | None = None) -> tuple[Path | None, str]:
    """The compiled build to run on (None: the source), and a line saying
    which and why. mode: auto (the build when current), on (the build, or
    FailedPrecondition saying why not), off (the source)."""
    if mode not in MODES:
        raise FailedPrecondition(f"compiled mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "off":
        return None, "code: python source (--compiled off)"
    roots = roots or PackageRoots.of_installed()
    tree = Path(folder) if folder else default_dir(roots)
    why = why_not_current(tree, roots)
    if why is None:
        return tree, f"code: mypyc-compiled modules from {tree}"
    if mode == "on":
        raise FailedPrecondition(f"--compiled on: {why}")
    return None, f"code: python source; {why}"


def is_compiled(module_file: str | None) -> bool:
    """Whether a module was loaded from a compiled extension (its __file__)."""
    return module_file is not None and not module_file.endswith(".py")


def mypy_version() -> str | None:
    try:
        from mypy.version import __version__
    except ImportError:
        return None
    return str(__version__)
