"""ReturnsCore: session-return foresight as the predictor service serves it.

A thread-safe face over one ReturnTracker (tracker.py) fed by two streams
that reach the predictor separately: arrivals (ObserveArrivals, reported by
the scheduler when it routes; conversation = family) and turn ends
(ReportTurnEnds, reported by routers when a turn's answer completes). It
answers, for the open conversations, P(next turn within `within_s` of now |
not back yet), likeliest first. Pure: no gRPC, no environment, no file IO;
time is the injected clock or the caller's `now_s`.

Two streams, one order. The tracker wants events in time order; here they
come from two reporters, each batched, so a turn end can overtake the report
of its own arrival, and the same arrival can be reported twice (a warm start
replaying history the tracker was warmed with). Two rules keep that from
corrupting the conversation's history:
- a turn end's arrival_s is matched to the conversation's held arrival
  nearest to it within `arrival_match_s` (the router's arrival time and the
  scheduler's stamp differ by the Route call); with none that near, the
  router's time is entered as the arrival (the report may still come);
- an arrival within `arrival_match_s` of one the conversation already holds
  is that arrival reported again: it is not fed twice (fed twice, it would
  count as the conversation's next turn and close it).
So two genuine turns of one conversation less than arrival_match_s apart
count as one. Event times older than the newest seen are clamped by the
feature builder (features.py); a late report shifts a row by its delay.

Validation: a ReportTurnEnds batch is all or nothing (InvalidArgument names
the first bad turn end, nothing is applied). A turn end ends at or after it
arrives, and end_s lies within max_clock_skew_s of the clock either way (like
Forecast's now_s: a far-future end would move the builder's time past what
later reports can correct). A bad arrival is skipped here without a word:
the count core counts and reports it.

Recalibration: the tracker shifts the model's level online as the model's
manifest says (store.py "recalibration", recalibration.py; absent: off), fed
by the same arrivals and turn ends, so the served forecasts are the ones
the bench scores.

Structural signal: a turn end's follow_ups (requests the router says will
follow with this turn's prompt as their prefix, an agent's sub-agents) is
the feature builder's signal column, as given (at most MAX_FOLLOW_UPS); the
model learns what it is worth, no rule acts on it.

Without a model (no --returns-model) there is no tracker: turn ends are
validated and dropped, arrivals ignored, and forecast() is FailedPrecondition,
which the scheduler reads as "plan on family bursts alone".

Online learning (a TurnSink, fitting/returns/online.py): every valid new
arrival and every accepted turn end is also handed to the sink, with or
without a tracker, after the lock is released (the sink has its own).
serve() puts a model the learner validated in service: with a tracker, one
O(1) model swap under the lock; without one (a cold start), a tracker is
built and warmed off the lock, then installed with one assignment.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, Protocol, Sequence

import numpy as np

from speckv.services.common.clock import Clock
from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.predictor.serving.clock_skew import checked_now
from speckv.services.predictor.serving.observations import Arrival
from speckv.services.predictor.serving.returns.tracker import ReturnTracker

if TYPE_CHECKING:  # store.py imports LightGBM: a predictor without a return model need not load it
    from speckv.services.predictor.serving.returns.store import PastTurn, SavedReturnModel

_ARRIVAL, _END = 0, 1
MAX_FOLLOW_UPS = 65_536  # a turn end announcing more is a client bug, not an agent


@dataclass(frozen=True, slots=True)
class ReturnsSettings:
    """Limits of the served tracker and of one call. Seconds throughout."""

    max_open_conversations: int = 100_000  # the tracker's LRU cap (services/config/predictor.json)
    max_idle_s: float = 3_600.0  # an open conversation idle longer is dropped
    max_conversations_held: int = 100_000  # the feature builder's cap on conversations it remembers
    max_turn_ends_per_call: int = 10_000
    max_conversations_per_call: int = 100_000  # most returns one ForecastReturns answers
    max_within_s: float = 3_600.0  # longest window a forecast may ask for
    max_conversation_len: int = 1024  # characters, as for a family
    max_clock_skew_s: float = 300.0  # a turn end or now_s further than this from the clock is refused; 0: no limit
    max_future_s: float = 60.0  # arrivals further ahead of the clock are not tracked; 0: no limit
    arrival_match_s: float = 1.0  # module docstring: matching turn ends to arrivals, repeated arrivals

    def validate(self) -> None:
        for name in ("max_open_conversations", "max_conversations_held", "max_turn_ends_per_call",
                     "max_conversations_per_call", "max_conversation_len"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name}={getattr(self, name)}: must be >= 1")
        for name in ("max_idle_s", "max_within_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InvalidArgument(f"{name}={value}: must be finite and > 0")
        for name in ("max_clock_skew_s", "max_future_s", "arrival_match_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidArgument(f"{name}={value}: must be finite and >= 0")


class TurnSink(Protocol):
    """Where online learning takes the traffic (fitting/returns/online.py)."""

    def arrival(self, conversation: str, time_s: float, prompt_tokens: int = 0) -> None: ...

    def turn_end(self, conversation: str, end_s: float, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 follow_ups: float = 0.0) -> None: ...


@dataclass(frozen=True, slots=True)
class TurnEndRecord:
    """One completed turn as a router reports it. Seconds, the predictor's clock."""

    conversation: str
    arrival_s: float
    end_s: float
    prompt_tokens: int
    output_tokens: int
    follow_ups: int = 0  # requests announced to follow with this turn's prompt as prefix: the signal feature


@dataclass(slots=True)
class TurnEndResult:
    accepted: int  # turn ends applied (0 without a model)
    opened: int  # of those, conversations now open (awaiting their next turn)
    open_conversations: int
    model: str  # version in service; "" without a model


@dataclass(slots=True)
class ReturnsAnswer:
    """Rows likeliest first (ties: the older turn end first)."""

    conversations: list[str]
    probabilities: np.ndarray  # float64, P(next turn within the window | not yet)
    model: str
    now_s: float
    open_conversations: int  # before the filters


@dataclass(slots=True)
class _Counters:
    turn_ends: int = 0  # applied
    refused_batches: int = 0
    arrivals: int = 0  # fed to the tracker
    repeated_arrivals: int = 0  # recognised as reported before, not fed again
    matched_arrivals: int = 0  # turn ends whose arrival was matched to a reported one


class ReturnsCore:
    """The served tracker (module docstring). Thread-safe: one lock guards it."""

    def __init__(self, clock: Clock, settings: ReturnsSettings, saved: SavedReturnModel | None = None,
                 sink: TurnSink | None = None) -> None:
        settings.validate()
        self._clock = clock
        self._settings = settings
        self._lock = threading.Lock()
        self._counters = _Counters()
        self._saved = saved
        self._sink = sink
        self._tracker: ReturnTracker | None = None
        if saved is not None:
            self._tracker = self._new_tracker(saved)

    def _new_tracker(self, saved: SavedReturnModel) -> ReturnTracker:
        s = self._settings
        spec = replace(saved.spec, max_conversations=s.max_conversations_held)
        return ReturnTracker(saved.model, spec, s.max_open_conversations, s.max_idle_s, saved.recalibration)

    def serve(self, saved: SavedReturnModel, history: Sequence[PastTurn] = ()) -> None:
        """Puts saved in service (module docstring): history warms a tracker
        built for a cold start (ignored when a tracker exists). The model's
        features must be the served spec's (ValueError otherwise)."""
        tracker = self._tracker
        if tracker is None:
            fresh = self._new_tracker(saved)
            _replay(fresh, history)
            with self._lock:
                self._tracker, self._saved = fresh, saved
            return
        with self._lock:
            tracker.set_model(saved.model)
            self._saved = saved

    @property
    def model_version(self) -> str:
        """The return model in service; "" when there is none."""
        return "" if self._saved is None else self._saved.version

    @property
    def open_conversations(self) -> int:
        if self._tracker is None:
            return 0
        with self._lock:
            return len(self._tracker)

    def counters(self) -> dict[str, int]:
        with self._lock:
            c = self._counters
            return {"turn_ends": c.turn_ends, "refused_batches": c.refused_batches, "arrivals": c.arrivals,
                    "repeated_arrivals": c.repeated_arrivals, "matched_arrivals": c.matched_arrivals}

    # --- inputs --------------------------------------------------------------

    def observe(self, arrivals: Iterable[Arrival]) -> int:
        """Feeds valid, new arrivals to the tracker; returns how many."""
        tracker, sink = self._tracker, self._sink
        if tracker is None and sink is None:
            return 0
        s = self._settings
        latest = self._clock.now() + s.max_future_s if s.max_future_s > 0 else math.inf
        fed: list[Arrival] = []
        with self._lock:
            for a in arrivals:
                if (not a.family or len(a.family) > s.max_conversation_len or not math.isfinite(a.time_s)
                        or a.time_s < 0 or a.time_s > latest or a.prompt_tokens < 0):
                    continue
                if tracker is not None:
                    if tracker.features.nearest_arrival(a.family, a.time_s, s.arrival_match_s) is not None:
                        self._counters.repeated_arrivals += 1
                        continue
                    tracker.arrival(a.family, a.time_s, a.prompt_tokens)
                fed.append(a)
            self._counters.arrivals += len(fed)
        if sink is not None:
            for a in fed:
                sink.arrival(a.family, a.time_s, a.prompt_tokens)
        return len(fed)

    def report(self, turn_ends: Sequence[TurnEndRecord]) -> TurnEndResult:
        """Applies a batch of turn ends (all or nothing), in end order."""
        try:
            self._check_turn_ends(turn_ends)
        except InvalidArgument:
            with self._lock:
                self._counters.refused_batches += 1
            raise
        sink = self._sink
        if sink is not None:
            for t in turn_ends:
                sink.turn_end(t.conversation, t.end_s, t.arrival_s, t.prompt_tokens, t.output_tokens,
                              float(t.follow_ups))
        tracker = self._tracker
        if tracker is None:
            return TurnEndResult(0, 0, 0, "")
        match_s = self._settings.arrival_match_s
        opened = 0
        with self._lock:
            for t in sorted(turn_ends, key=lambda t: t.end_s):
                arrival = tracker.features.nearest_arrival(t.conversation, t.arrival_s, match_s)
                if arrival is None:
                    arrival = t.arrival_s
                else:
                    self._counters.matched_arrivals += 1
                opened += int(tracker.turn_end(t.conversation, t.end_s, arrival, t.prompt_tokens, t.output_tokens,
                                               float(t.follow_ups)))
            self._counters.turn_ends += len(turn_ends)
            open_now = len(tracker)
        return TurnEndResult(len(turn_ends), opened, open_now, self.model_version)

    def warm(self, turns: Sequence[PastTurn]) -> int:
        """Feeds history (arrivals and the turn ends it holds) in time order,
        an arrival before an end at the same time, as the simulator warms its
        tracker; no skew or repeat checks (it is the service's own history,
        older than any report). Returns the turn ends fed."""
        tracker = self._tracker
        if tracker is None:
            raise FailedPrecondition("no session-return model to warm (start with --returns-model)")
        with self._lock:
            return _replay(tracker, turns)

    # --- forecasts -----------------------------------------------------------

    def forecast(self, within_s: float, now_s: float | None = None, max_conversations: int = 0,
                 min_probability: float = 0.0) -> ReturnsAnswer:
        """P(each open conversation's next turn within within_s of now | not
        yet) >= min_probability, likeliest first, at most max_conversations
        (0: up to max_conversations_per_call). FailedPrecondition without a model."""
        s = self._settings
        if not (math.isfinite(within_s) and 0 < within_s <= s.max_within_s):
            raise InvalidArgument(f"within_s={within_s}: must be > 0 and <= {s.max_within_s:g}")
        if max_conversations < 0:
            raise InvalidArgument(f"max_conversations={max_conversations}: must be >= 0")
        if not (math.isfinite(min_probability) and 0.0 <= min_probability <= 1.0):
            raise InvalidArgument(f"min_probability={min_probability}: must be in [0, 1]")
        now = self._now(now_s)
        tracker = self._tracker
        if tracker is None:
            raise FailedPrecondition("no session-return model is loaded (start the predictor with "
                                     "--returns-model DIR): no return forecasts")
        with self._lock:
            conversations, p = tracker.p_within(now, within_s)
            held = len(conversations)
        keep = np.flatnonzero(p >= min_probability)
        order = keep[np.argsort(-p[keep], kind="stable")]
        limit = min(max_conversations or s.max_conversations_per_call, s.max_conversations_per_call)
        order = order[:limit]
        return ReturnsAnswer([conversations[i] for i in order.tolist()], p[order], self.model_version, now, held)

    # --- checks --------------------------------------------------------------

    def _now(self, now_s: float | None) -> float:
        """now_s checked as Forecast's is (clock_skew.py)."""
        return checked_now(now_s, self._clock.now(), self._settings.max_clock_skew_s)

    def _check_turn_ends(self, turn_ends: Sequence[TurnEndRecord]) -> None:
        s = self._settings
        if len(turn_ends) > s.max_turn_ends_per_call:
            raise InvalidArgument(f"turn_ends: {len(turn_ends)} given, at most {s.max_turn_ends_per_call} per call")
        clock_now = self._clock.now()
        for i, t in enumerate(turn_ends):
            where = f"turn_ends[{i}]"
            if not t.conversation:
                raise InvalidArgument(f"{where}.conversation is empty")
            if len(t.conversation) > s.max_conversation_len:
                raise InvalidArgument(f"{where}.conversation is longer than {s.max_conversation_len} characters")
            for name in ("arrival_s", "end_s"):
                value = getattr(t, name)
                if not (math.isfinite(value) and value >= 0):
                    raise InvalidArgument(f"{where}.{name}={value!r}: must be finite and >= 0")
            if t.end_s < t.arrival_s:
                raise InvalidArgument(f"{where}: end_s={t.end_s!r} is before arrival_s={t.arrival_s!r}")
            if s.max_clock_skew_s > 0 and abs(t.end_s - clock_now) > s.max_clock_skew_s:
                raise InvalidArgument(f"{where}.end_s={t.end_s!r} is {t.end_s - clock_now:+.3f} s from the "
                                      f"predictor's clock ({clock_now!r}); at most max_clock_skew_s="
                                      f"{s.max_clock_skew_s:g} s either way")
            if t.prompt_tokens < 0 or t.output_tokens < 0:
                raise InvalidArgument(f"{where}: token counts must be >= 0")
            if not 0 <= t.follow_ups <= MAX_FOLLOW_UPS:
                raise InvalidArgument(f"{where}.follow_ups={t.follow_ups}: must be in [0, {MAX_FOLLOW_UPS}]")


def _replay(tracker: ReturnTracker, turns: Sequence[PastTurn]) -> int:
    """Feeds turns' arrivals and ends in time order (an arrival before an end
    at the same time); returns the turn ends fed."""
    events: list[tuple[float, int, int]] = []
    for i, t in enumerate(turns):
        events.append((t.arrival_s, _ARRIVAL, i))
        if t.end_s is not None:
            events.append((t.end_s, _END, i))
    events.sort()
    ends = 0
    for time_s, kind, i in events:
        t = turns[i]
        if kind == _ARRIVAL:
            tracker.arrival(t.conversation, time_s, t.prompt_tokens)
        else:
            tracker.turn_end(t.conversation, time_s, t.arrival_s, t.prompt_tokens, t.output_tokens,
                             float(t.follow_ups))
            ends += 1
    return ends
