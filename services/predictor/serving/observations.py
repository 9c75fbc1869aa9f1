"""Arrival observations and the reasons one is refused.

A bad observation is rejected on its own, with a counted reason; it never
fails the batch or the stream it came in.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class RejectReason(enum.Enum):
    EMPTY_FAMILY = "empty_family"
    FAMILY_TOO_LONG = "family_too_long"
    BAD_TIME = "bad_time"  # not finite, or negative
    BAD_TOKENS = "bad_tokens"  # negative, or more cached than prompt tokens
    FROM_FUTURE = "from_future"  # further ahead of the predictor's clock than allowed
    TOO_OLD = "too_old"  # before the window the series still holds


@dataclass(slots=True)
class Arrival:
    """One request's arrival. time_s is in the predictor's clock domain."""

    time_s: float
    family: str
    node_id: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class Rejection:
    reason: RejectReason
    message: str


@dataclass(slots=True)
class ObserveResult:
    accepted: int = 0
    rejected: int = 0
    first_error: str = ""  # why the first rejected observation was rejected

    def reject(self, rejection: Rejection) -> None:
        if not self.rejected:
            self.first_error = rejection.message
        self.rejected += 1

    def merge(self, other: "ObserveResult") -> None:
        if other.rejected and not self.rejected:
            self.first_error = other.first_error
        self.accepted += other.accepted
        self.rejected += other.rejected


def check_arrival(arrival: Arrival, max_family_len: int, latest_allowed_s: float) -> Rejection | None:
    """Why arrival cannot be counted, or None when it can (the window check is
    the series' business: it knows what it still holds)."""
    if not arrival.family:
        return Rejection(RejectReason.EMPTY_FAMILY, "family is empty")
    if len(arrival.family) > max_family_len:
        return Rejection(RejectReason.FAMILY_TOO_LONG,
                         f"family is {len(arrival.family)} characters (at most {max_family_len})")
    if not (math.isfinite(arrival.time_s) and arrival.time_s >= 0):
        return Rejection(RejectReason.BAD_TIME, f"time_s={arrival.time_s!r}: must be finite and >= 0")
    if arrival.time_s > latest_allowed_s:
        return Rejection(RejectReason.FROM_FUTURE,
                         f"time_s={arrival.time_s!r} is after {latest_allowed_s!r}, the predictor's clock "
                         "plus max_future_s")
    if arrival.prompt_tokens < 0 or arrival.cached_tokens < 0:
        return Rejection(RejectReason.BAD_TOKENS, "token counts must be >= 0")
    if arrival.cached_tokens > arrival.prompt_tokens:
        return Rejection(RejectReason.BAD_TOKENS,
                         f"cached_tokens={arrival.cached_tokens} exceeds prompt_tokens={arrival.prompt_tokens}")
    return None
