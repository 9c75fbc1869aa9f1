"""paired_runs cuts page lists into runs consecutive on both sides."""
from __future__ import annotations

import pytest

from speckv.services.kvstore.shm.runs import Run, paired_runs


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9])
def test_consecutive_pages_are_one_run(n):
    runs = paired_runs(list(range(10, 10 + n)), list(range(3, 3 + n)))
    assert runs == ([Run(10, 3, n, 0)] if n else [])


def test_a_break_on_either_side_starts_a_run():
    assert paired_runs([1, 2, 3, 7, 8], [5, 6, 9, 10, 11]) == [
        Run(1, 5, 2, 0), Run(3, 9, 1, 2), Run(7, 10, 2, 3)]
    assert paired_runs([4, 3], [0, 1]) == [Run(4, 0, 1, 0), Run(3, 1, 1, 1)]


def test_every_pair_is_covered_once():
    sources, targets = [5, 6, 2, 3, 4, 9], [0, 1, 2, 7, 8, 3]
    pairs = [(r.src + i, r.dst + i) for r in paired_runs(sources, targets) for i in range(r.count)]
    assert pairs == list(zip(sources, targets))


def test_unequal_lengths_are_refused():
    with pytest.raises(ValueError):
        paired_runs([1, 2], [1])
