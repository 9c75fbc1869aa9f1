"""OnlineFeatures kept in step with the core's ArrivalSeries.

Steps enter the features once complete: when an observation moves the series
head on (the head's step is then done) and when a forecast is asked at a
later time. Each step's counts are read from the ring before the head can
move past them, so nothing is lost; an observation that arrives late, for a
step already taken in, is counted by the series but not by the features.
A feature row follows a series row; when the series hands a row to a new
family (its serial changes) the row's feature history is forgotten first.
Built while traffic already flowed (a model swapped in), the features
replay the whole window the ring holds. After an idle gap longer than
MAX_GAP_WINDOWS windows the state starts over (every feature has decayed to
its idle value by then, up to the EWMA tails).

`version` changes whenever sync changes what features() returns for any row
(a step taken in, a row forgotten, rows added, the state started over), so
values a caller derives from the features may be kept while it stays equal.
A row the series hands out between two steps keeps the row's feature state
until the next step is taken in: zeros for a new row, the forgotten
family's decayed history for a reused one (an approximation for under one
step, kept as it was).
"""
from __future__ import annotations

import numpy as np

from speckv.services.predictor.serving.arrival_ring import ArrivalSeries
from speckv.services.predictor.serving.feature_spec import FeatureSpec
from speckv.services.predictor.serving.features import OnlineFeatures

MAX_GAP_WINDOWS = 4


class LiveFeatures:
    def __init__(self, spec: FeatureSpec, series: ArrivalSeries) -> None:
        self.spec = spec
        self.online = OnlineFeatures(spec, capacity=series.capacity)
        self._serials = series.row_serials.copy()
        self.version = 0

    def sync(self, series: ArrivalSeries, upto_step: int) -> None:
        """Takes in every complete step through upto_step; makes room for
        every row the series has, even when no step is complete (a forecast
        may ask about rows added since the last step)."""
        head, online = series.head_step, self.online
        if online.capacity < series.capacity:
            online.grow(series.capacity)
            self.version += 1
        if head is None:
            return
        if online.next_step is None:
            online.next_step = max(series.origin_step or head, head - series.window_steps + 1)
        if upto_step < online.next_step:
            return
        self.version += 1
        if upto_step - online.next_step > MAX_GAP_WINDOWS * series.window_steps:
            self.online = online = OnlineFeatures(self.spec, capacity=series.capacity)
            online.next_step = upto_step - series.window_steps + 1
        serials = series.row_serials
        if len(self._serials) < len(serials):
            self._serials = np.concatenate([self._serials, np.zeros(len(serials) - len(self._serials), np.int64)])
        changed = np.flatnonzero(self._serials != serials)
        if len(changed):
            online.reset_rows(changed)
            self._serials[changed] = serials[changed]
        for step in range(online.next_step, upto_step + 1):
            counts, total = series.column(step)
            online.advance(step, counts, total)
