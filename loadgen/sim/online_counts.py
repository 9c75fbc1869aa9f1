"""The count and burst models learned online in virtual time (`speckv
simulate --predictor online`; issue 45, item 1): the live predictor's
Retrainer (services/predictor/fitting/retrain.py), on the simulation's own
PredictorCore, called by the Simulation every `interval_s` of virtual time.

A cold start: the core serves the builtin EWMA (as `--predictor builtin`)
until the first refit that validates; each refit trains LightGBM (the quick
hyperparameters, as `--predictor lightgbm`) on the core's sliding window
(PredictorConfig.window_s of arrivals the simulation has routed, nothing of
the trace it has not), validates it against the EWMA and the model in
service on the window's newest steps, and swaps it in or keeps the old one,
exactly as the live predictor's `--retrain-interval-s` does. A refit runs
synchronously at its virtual time, seeded and on the training config's
threads, so a run is deterministic. Retrainer writes each version as a model
directory: here a temporary directory, removed by close().
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from speckv.services.predictor.fitting.retrain import RetrainOutcome, RetrainResult, Retrainer, RetrainSettings
from speckv.services.predictor.fitting.training import load_config
from speckv.services.predictor.serving.core import PredictorCore

REFIT_INTERVAL_S = 300.0  # RetrainSettings' default: the live predictor's interval when it is switched on


@dataclass(slots=True)
class SimCountRefits:
    """Refits of one simulation's core; results: (virtual time, outcome) of every refit tried."""

    retrainer: Retrainer
    interval_s: float
    directory: tempfile.TemporaryDirectory[str]
    results: list[tuple[float, RetrainResult]] = field(default_factory=list)

    @classmethod
    def build(cls, core: PredictorCore, interval_s: float | None = None) -> "SimCountRefits":
        interval_s = interval_s if interval_s is not None else REFIT_INTERVAL_S
        directory = tempfile.TemporaryDirectory(prefix="speckv-sim-refits-")
        settings = RetrainSettings(Path(directory.name), interval_s=interval_s)
        return cls(Retrainer(core, load_config(quick=True), settings), interval_s, directory)

    def tick(self, now: float) -> None:
        """One refit at virtual time now (the Simulation calls it every interval_s)."""
        self.results.append((now, self.retrainer.retrain_once()))

    def swaps(self) -> list[float]:
        return [at for at, result in self.results if result.outcome is RetrainOutcome.SWAPPED]

    def note(self) -> str:
        swaps = self.swaps()
        first = f", first served at {swaps[0]:.0f} s" if swaps else ", none served"
        return (f"count and burst models refitted online every {self.interval_s:g} s: {len(self.results)} refits, "
                f"{len(swaps)} served{first}")

    def close(self) -> None:
        self.directory.cleanup()
