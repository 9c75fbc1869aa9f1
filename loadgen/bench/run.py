"""`speckv bench NAME [flags]`: dispatch to speckv.loadgen.bench.NAME.cli.main."""
from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Mapping, Sequence

import speckv.loadgen.bench as bench_package


def available() -> list[str]:
    """One sub-package per benchmark, its command in NAME/cli.py."""
    return sorted(m.name for m in pkgutil.iter_modules(bench_package.__path__) if m.ispkg)


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: speckv bench NAME [flags]\n\nbenchmarks: " + (", ".join(names) or "(none yet)"))
        return 0 if argv else 2
    if argv[0] not in names:
        print(f"speckv bench: unknown benchmark {argv[0]!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    return importlib.import_module(f"speckv.loadgen.bench.{argv[0]}.cli").main(list(argv[1:]), environ)
