"""ServedModelRecord: what GetModelInfo says of each model in service (its
version, where it came from, the window of traffic it was fitted on and how
it validated), filled by whoever put it there: the loader, the retrainer,
online learning (issue 45). Seconds on the predictor's clock."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServedModelRecord:
    """Invariant: window_start_s <= window_end_s; both 0 for a model not
    fitted on this predictor's traffic (then fitted_at_s is 0 too)."""

    kind: str  # "count" or "return"
    version: str
    origin: str  # builtin, loaded, warm start, online, online baseline
    window_start_s: float = 0.0
    window_end_s: float = 0.0
    fitted_at_s: float = 0.0
    training_rows: int = 0
    validation_metric: str = ""  # empty: not validated here
    validation_score: float = math.nan
    replaced_score: float = math.nan
    online_learning: bool = False  # this kind is refitted from the traffic
