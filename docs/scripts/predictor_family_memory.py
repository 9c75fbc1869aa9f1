"""The memory per tracked family of the predictor (docs/limits.md,
`max_families_tracked`): a PredictorCore with the shipped defaults
(PredictorConfig: 1 s steps, a 600 s window) observes N distinct families,
one arrival each inside the window, then serves one Forecast and one
top-k (so whatever is kept per row for a forecast exists too); the bytes
it holds are measured with tracemalloc (NumPy's arrays included) and as
the process's RSS growth. Run for the builtin EWMA and for a LightGBM
model with online features (trained on planted counts, quick rounds), and
once with the cap at N / 2 to show the table stays at the cap.

    PYTHONPATH=. .venv/bin/python docs/scripts/predictor_family_memory.py [N]
"""
from __future__ import annotations

import dataclasses
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

from speckv.loadgen.bench.predictor.planted import save_planted_model
from speckv.services.common.clock import ManualClock
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.serving.core import PredictorCore
from speckv.services.predictor.serving.manifest import load_model
from speckv.services.predictor.serving.observations import Arrival

NOW = 100_000.0
MIB = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def measure(model, families: int, cap: int) -> tuple[int, int, int]:
    """(tracemalloc bytes held, RSS growth, families tracked) after the feed."""
    config = PredictorConfig()
    settings = dataclasses.replace(config.core_settings(), max_families_tracked=cap)
    clock = ManualClock(NOW)
    gc.collect()
    rss_before = rss_bytes()
    tracemalloc.start()
    core = PredictorCore(clock, model, settings)
    span = config.window_s / 2  # every arrival stays inside the window
    core.observe(Arrival(NOW - span + span * i / families, f"tenant-{i:08d}/doc-{i * 7919 % 100_003}")
                 for i in range(families))
    core.forecast(["tenant-00000001/doc-7919"])
    core.top_families(10)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return held, rss_bytes() - rss_before, core.families_tracked


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    with tempfile.TemporaryDirectory() as tmp:
        lightgbm = load_model(save_planted_model(Path(tmp) / "m"))
    models = {"builtin EWMA": PredictorConfig().builtin_model(), "LightGBM (planted)": lightgbm}
    print(f"{n:,} families, 1 arrival each; window 600 s of 1 s steps")
    for label, model in models.items():
        for cap in (0, n // 2):
            held, rss, tracked = measure(model, n, cap)
            print(f"{label:20s} cap {cap or 'none':>7}: {tracked:>7,} tracked, tracemalloc {held / MIB:7.1f} MiB "
                  f"({held / tracked:,.0f} B per tracked family), RSS +{rss / MIB:7.1f} MiB")


if __name__ == "__main__":
    main()
