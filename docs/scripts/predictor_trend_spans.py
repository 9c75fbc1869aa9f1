"""The scripted experiment behind `features.trend_spans` (docs/predictor.md,
"Bursts seen early"): a burst announced only by other families rising
together (tests/unit/services/predictor/fitting/test_burst_model.py's generator),
trained on the first 70 % with each set of spans, burst alarms at 5 s scored
on the rest. Never run on a benchmark trace.

    PYTHONPATH=. .venv/bin/python docs/scripts/predictor_trend_spans.py
"""
from __future__ import annotations

import dataclasses

import numpy as np

from speckv.services.predictor.fitting.dataset import build_rows
from speckv.services.predictor.fitting.family_counts import FamilyCounts
from speckv.services.predictor.fitting.training import load_config, train_on_counts
from speckv.services.predictor.judging.evaluation import burst_score
from tests.unit.services.predictor.fitting.test_burst_model import _precursor_counts

H5 = 2  # the 5 s horizon


def main() -> None:
    base = load_config(quick=True)
    for spans in [(2, 5, 10), (2, 5), (5,), (3,), ()]:
        out = []
        for seed in (5, 6, 7):
            config = dataclasses.replace(base, spec=dataclasses.replace(base.spec, trend_spans=spans))
            data = _precursor_counts(seed)
            split = int(0.7 * data.steps)
            train = FamilyCounts(data.families, data.counts[:, :split].tocsr(), 1.0, 0.0)
            bundle = train_on_counts(train, config).bundle
            rows = build_rows(data, bundle.spec, config.horizons_s, config.track_s)
            rows = rows.take(np.flatnonzero(rows.step >= split))
            _, _, prob = bundle.predict(rows.X)
            s = burst_score(rows.label[:, H5], prob[:, H5] >= bundle.alarm_threshold[H5], rows.onset[:, H5],
                            rows.family, rows.step, 1.0)
            out.append(f"precision {s.precision:.2f} recall {s.recall:.2f} early {s.early:.2f}")
        print(spans, " | ".join(out), flush=True)


if __name__ == "__main__":
    main()
