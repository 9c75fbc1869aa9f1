"""Synthetic arrival streams for predictor tests: steady Poisson families plus
one family with planted periodic bursts (seeded, so every run is the same).
The helpers live in loadgen/bench/predictor/planted.py, where the
crafted-model bench uses them too."""
from __future__ import annotations

from speckv.loadgen.bench.predictor.planted import (
    BURST_PERIOD_S,
    BURST_SIZE,
    BURST_SPREAD_S,
    planted_arrivals,
    planted_counts,
    save_planted_model,
)

__all__ = ["BURST_PERIOD_S", "BURST_SIZE", "BURST_SPREAD_S", "planted_arrivals", "planted_counts",
           "save_planted_model"]
