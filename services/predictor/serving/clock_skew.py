"""The one rule for a caller's `now_s` (Forecast, ForecastReturns,
ReportTurnEnds): finite, >= 0 and, with max_skew_s > 0, within that many
seconds of the predictor's clock either way, so one far-future call cannot
move the state later calls read. Seconds. Pure."""
from __future__ import annotations

import math

from speckv.services.common.errors import InvalidArgument


def checked_now(now_s: float | None, clock_now: float, max_skew_s: float) -> float:
    """now_s as the caller's time (the clock's when None); InvalidArgument when it breaks the rule."""
    if now_s is None:
        return clock_now
    if not (math.isfinite(now_s) and now_s >= 0):
        raise InvalidArgument(f"now_s={now_s}: must be finite and >= 0")
    if max_skew_s > 0 and abs(now_s - clock_now) > max_skew_s:
        raise InvalidArgument(f"now_s={now_s!r} is {now_s - clock_now:+.3f} s from the predictor's clock "
                              f"({clock_now!r}); at most max_clock_skew_s={max_skew_s:g} s either way")
    return float(now_s)
