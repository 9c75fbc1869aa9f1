#!/usr/bin/env python3
"""Copies services/config/*.json into deploy/k8s/base/config/, where the base
kustomization's configMapGenerator reads them.

Kustomize refuses files outside a kustomization's own directory (its load
restrictor, which `kubectl apply -k` cannot turn off, also refuses symlinks
that lead out), so the base cannot name services/config/*.json in place: it
reads these copies. Run this after editing services/config; `--check` only
reports copies that differ, are missing or are left over (exit 1), and
tests/unit/test_k8s_manifests.py fails on the same.

    python deploy/k8s/sync_config.py            # write the copies
    python deploy/k8s/sync_config.py --check    # exit 1 if they are stale
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE = REPO_ROOT / "services" / "config"
TARGET = Path(__file__).resolve().parent / "base" / "config"


def stale(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """Names under target that differ from source, are missing or are extra."""
    wanted = {p.name: p.read_bytes() for p in sorted(source.glob("*.json"))}
    present = {p.name: p.read_bytes() for p in sorted(target.glob("*.json"))} if target.is_dir() else {}
    return sorted(name for name in wanted.keys() | present.keys() if wanted.get(name) != present.get(name))


def sync(source: Path = SOURCE, target: Path = TARGET) -> list[str]:
    """Makes target's *.json equal source's; returns the names it changed."""
    changed = stale(source, target)
    target.mkdir(parents=True, exist_ok=True)
    for name in changed:
        if (source / name).exists():
            (target / name).write_bytes((source / name).read_bytes())
        else:
            (target / name).unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report stale copies (exit 1), write nothing")
    args = parser.parse_args(argv)
    rel = TARGET.relative_to(REPO_ROOT)
    if args.check:
        names = stale()
        for name in names:
            print(f"stale: {rel / name} (run python deploy/k8s/sync_config.py)")
        return 1 if names else 0
    for name in sync():
        print(f"updated {rel / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
