"""LoadBoard against a brute-force reference: every live node sorted by (load, last update)."""
from __future__ import annotations

import random

import pytest

from speckv.services.scheduler.load_board import LoadBoard


class _Reference:
    def __init__(self) -> None:
        self.load: dict[str, tuple[float, int]] = {}
        self.heartbeat: dict[str, float] = {}
        self.version = 0

    def set_load(self, node: str, load: float) -> None:
        self.version += 1
        self.load[node] = (load, self.version)

    def least_loaded(self, k, now, timeout_s, exclude=(), counted=None):
        live = sorted((lv, n) for n, lv in self.load.items() if self.heartbeat[n] >= now - timeout_s)
        out, found = [], 0
        for _, n in live:
            if found >= k:
                break
            if n not in exclude:
                out.append(n)
                found += counted is None or n in counted
        return out


@pytest.mark.parametrize("nodes", [1, 2, 7, 64])
@pytest.mark.parametrize("seed", range(4))
def test_load_board_matches_a_sorted_scan(nodes, seed):
    rng = random.Random(seed)
    board, ref = LoadBoard(), _Reference()
    names = [f"n{i}" for i in range(nodes)]
    now = 100.0
    for step in range(2_000):
        node = rng.choice(names)
        action = rng.random()
        load = float(rng.randrange(6))  # few distinct loads: ties are the common case
        if action < 0.3 or node not in ref.heartbeat:
            beat = now - rng.choice([0.0, 0.0, 0.0, 10.0])  # some heartbeats are already too old
            board.upsert(node, load, beat)
            ref.heartbeat[node] = beat
            ref.set_load(node, load)
        elif action < 0.6:
            board.set_load(node, load)
            ref.set_load(node, load)
        else:
            k = rng.randrange(0, nodes + 2)
            exclude = set(rng.sample(names, rng.randrange(0, nodes + 1)))
            counted = None if rng.random() < 0.5 else set(rng.sample(names, rng.randrange(0, nodes + 1)))
            assert board.least_loaded(k, now, 5.0, exclude, counted) == ref.least_loaded(k, now, 5.0, exclude, counted)
        now += rng.choice([0.0, 0.5, 2.0])
