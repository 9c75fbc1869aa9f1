"""Pairs of page lists cut into runs that are consecutive on both sides, so a
copy between two paged pools is one strided copy per run and layer rather
than one per block (pages come off free stacks in order, so runs are long on
a fresh pool and short only after churn)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True)
class Run:
    """count pages: source[src + i] pairs with target[dst + i]; at is the
    position of the first pair in the lists given."""

    src: int
    dst: int
    count: int
    at: int


def paired_runs(sources: Sequence[int], targets: Sequence[int]) -> list[Run]:
    """Maximal runs where both lists step by +1; ValueError on unequal lengths."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source pages for {len(targets)} target pages")
    runs: list[Run] = []
    start = 0
    for i in range(1, len(sources) + 1):
        if i == len(sources) or sources[i] != sources[i - 1] + 1 or targets[i] != targets[i - 1] + 1:
            runs.append(Run(int(sources[start]), int(targets[start]), i - start, start))
            start = i
    return runs
