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
"""
from __future__ import annotations

import numpy as np

from speckv.services.predictor.features import FeatureSpec, OnlineFeatures
from speckv.services.predictor.series import ArrivalSeries

MAX_GAP_WINDOWS = 4


class LiveFeatures:
    def __init__(self, spec: FeatureSpec, series: ArrivalSeries) -> None:
        self.spec = spec
        self.online = OnlineFeatures(spec, capacity=series.capacity)
        self._serials = series.row_serials.copy()

    def sync(self, series: ArrivalSeries, upto_step: int) -> None:
        """Takes in every complete step through upto_step."""
        head, online = series.head_step, self.online
        if head is None:
            return
        if online.next_step is None:
            online.next_step = max(series.origin_step or head, head - series.window_steps + 1)
        if upto_step < online.next_step:
            return
        if upto_step - online.next_step > MAX_GAP_WINDOWS * series.window_steps:
            self.online = online = OnlineFeatures(self.spec, capacity=series.capacity)
            online.next_step = upto_step - series.window_steps + 1
        online.grow(series.capacity)
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
