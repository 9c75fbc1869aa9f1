"""Features of a turn's end: what is known when a conversation's turn ends.

ReturnFeatures is an online builder. It is fed events in time order:
`arrival(conversation, now, prompt_tokens)` when a request arrives and
`turn_end(conversation, now, arrival_s, ...)` when its answer completes; the
latter returns that turn end's feature row. Time is whatever the caller says
`now` is (seconds; the trace clock offline, the real clock live): the builder
never reads a clock. The offline dataset (dataset.py) replays a trace's turns
through this very builder, so live and offline features cannot drift.

Causality: a row is computed from the events fed so far, all of them at or
before `now` (an arrival at exactly `now` is fed before a turn end at `now`).
If `now` goes backwards it is clamped to the latest time seen.

Columns, in ReturnFeatureSpec.names() order (NaN where undefined):
- turn_index: the conversation's arrivals before this turn (0-based);
- prompt_tokens, output_tokens: this turn's;
- prompt_growth: prompt tokens minus the previous turn's (NaN for turn 0);
- gap_prev_s: this turn's arrival minus the previous turn's (NaN for turn 0);
- mean_gap_s: mean arrival-to-arrival gap over the conversation's turns up to
  this one, (arrival - first arrival) / turn_index (NaN for turn 0);
- age_s: now minus the conversation's first arrival;
- duration_s: now minus this turn's arrival (its service time);
- cluster_rate_<w>s: cluster arrivals in (now - w, now] per second, w in
  rate_windows_s;
- active_conversations_<w>s: conversations with an arrival in (now - w, now],
  w = active_window_s;
- return_share_<t>s: of the turn ends whose horizon-t window closed in
  (now - share_window_s, now] (end e with e + t in that interval, so the
  window fully elapsed before now), the share whose conversation's next
  arrival came by e + t (NaN when there is none). A turn that had already
  returned when it ended counts as returned;
- <signal_name>: a caller-supplied structural signal (e.g. parent prefill
  done for agent workloads), 0 when absent: a feature, never a rule.

Bounded state: at most max_conversations conversations (least recently
touched dropped first; a dropped conversation that returns starts again as
turn 0 and its pending end counts as not returned), their last turn_cap
arrivals, arrivals within the longest window, and turn ends until their
largest horizon's window has left the share window.
"""
from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

NAN = math.nan


@dataclass(frozen=True, slots=True)
class ReturnFeatureSpec:
    """Builder parameters (seconds). Invariants: horizons strictly
    increasing and > 0; windows > 0; caps >= 1."""

    horizons_s: tuple[float, ...] = (30.0, 60.0, 120.0, 300.0, 600.0)
    rate_windows_s: tuple[float, ...] = (60.0, 300.0)
    active_window_s: float = 300.0
    share_window_s: float = 600.0
    max_conversations: int = 100_000
    turn_cap: int = 64
    signal_name: str = "signal"

    def __post_init__(self) -> None:
        h = self.horizons_s
        if not h or any(x <= 0 or not math.isfinite(x) for x in h) or list(h) != sorted(set(h)):
            raise ValueError(f"horizons_s={h!r}: must be strictly increasing, finite and > 0")
        if any(w <= 0 for w in (*self.rate_windows_s, self.active_window_s, self.share_window_s)):
            raise ValueError("rate_windows_s, active_window_s, share_window_s: must be > 0")
        if self.max_conversations < 1 or self.turn_cap < 1:
            raise ValueError("max_conversations and turn_cap: must be >= 1")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], horizons_s: tuple[float, ...]) -> "ReturnFeatureSpec":
        return cls(horizons_s=tuple(float(x) for x in horizons_s),
                   rate_windows_s=tuple(float(x) for x in raw.get("rate_windows_s", (60.0, 300.0))),
                   active_window_s=float(raw.get("active_window_s", 300.0)),
                   share_window_s=float(raw.get("share_window_s", 600.0)),
                   max_conversations=int(raw.get("max_conversations", 100_000)),
                   turn_cap=int(raw.get("turn_cap", 64)), signal_name=str(raw.get("signal_name", "signal")))

    def names(self) -> tuple[str, ...]:
        return ("turn_index", "prompt_tokens", "output_tokens", "prompt_growth", "gap_prev_s", "mean_gap_s",
                "age_s", "duration_s", *(f"cluster_rate_{w:g}s" for w in self.rate_windows_s),
                f"active_conversations_{self.active_window_s:g}s",
                *(f"return_share_{t:g}s" for t in self.horizons_s), self.signal_name)


@dataclass(slots=True)
class _End:
    """A turn end awaiting resolution; return_s is set by the next arrival."""

    end_s: float
    return_s: float | None


@dataclass(slots=True)
class _Conversation:
    times: list[float] = field(default_factory=list)  # last turn_cap arrivals, ascending
    prompts: list[int] = field(default_factory=list)
    dropped: int = 0  # arrivals trimmed off the front of times
    first_s: float = NAN
    last_end: _End | None = None  # the newest end not yet returned


class ReturnFeatures:
    """The online feature builder (module docstring). Not thread-safe."""

    def __init__(self, spec: ReturnFeatureSpec) -> None:
        self.spec = spec
        self._now = -math.inf
        self._conversations: OrderedDict[str, _Conversation] = OrderedDict()
        self._rate_windows = [deque[float]() for _ in spec.rate_windows_s]
        self._active: deque[tuple[float, str]] = deque()
        self._active_count: dict[str, int] = {}
        self._pending = [deque[_End]() for _ in spec.horizons_s]
        self._resolved = [deque[tuple[float, bool]]() for _ in spec.horizons_s]
        self._returned = [0] * len(spec.horizons_s)

    @property
    def now(self) -> float:
        return self._now

    def names(self) -> tuple[str, ...]:
        return self.spec.names()

    def __len__(self) -> int:
        """Conversations held."""
        return len(self._conversations)

    def advance(self, now: float) -> float:
        """Moves time to max(now, latest seen): expires window entries and
        resolves turn ends whose horizon window has closed. Returns the time used."""
        now = max(float(now), self._now)
        self._now = now
        for window, times in zip(self.spec.rate_windows_s, self._rate_windows):
            while times and times[0] <= now - window:
                times.popleft()
        while self._active and self._active[0][0] <= now - self.spec.active_window_s:
            _, conversation = self._active.popleft()
            left = self._active_count[conversation] - 1
            if left:
                self._active_count[conversation] = left
            else:
                del self._active_count[conversation]
        for i, horizon in enumerate(self.spec.horizons_s):
            pending, resolved = self._pending[i], self._resolved[i]
            while pending and pending[0].end_s + horizon <= now:
                end = pending.popleft()
                closes = end.end_s + horizon
                returned = end.return_s is not None and end.return_s <= closes
                resolved.append((closes, returned))
                self._returned[i] += returned
            while resolved and resolved[0][0] <= now - self.spec.share_window_s:
                self._returned[i] -= resolved.popleft()[1]
        return now

    def arrival(self, conversation: str, now: float, prompt_tokens: int = 0) -> None:
        """A request of `conversation` arrived at `now`. The windows count it
        at the (clamped) builder time; the conversation's history keeps `now`
        as given, so a later turn_end(arrival_s=now) finds it."""
        given = float(now)
        now = self.advance(given)
        for times in self._rate_windows:
            times.append(now)
        self._active.append((now, conversation))
        self._active_count[conversation] = self._active_count.get(conversation, 0) + 1
        state = self._touch(conversation)
        pos = bisect.bisect_right(state.times, given)
        state.times.insert(pos, given)
        state.prompts.insert(pos, int(prompt_tokens))
        if pos == 0 and state.dropped == 0:
            state.first_s = given
        self._trim(state)
        if state.last_end is not None:
            state.last_end.return_s = now
            state.last_end = None

    def returned_since(self, conversation: str, arrival_s: float) -> float | None:
        """The first arrival of `conversation` after arrival_s seen so far
        (the turn that arrived at arrival_s has returned), else None."""
        state = self._conversations.get(conversation)
        if state is None:
            return None
        i = bisect.bisect_right(state.times, arrival_s)
        return state.times[i] if i < len(state.times) else None

    def nearest_arrival(self, conversation: str, time_s: float, tolerance_s: float) -> float | None:
        """The held arrival of `conversation` closest to time_s (the earlier
        one on a tie), if within tolerance_s of it; else None. Read-only: the
        live service matches a router's arrival time to the one the
        scheduler reported (they differ by the Route call) and recognises a
        reported arrival it already holds."""
        state = self._conversations.get(conversation)
        if state is None or not state.times:
            return None
        i = bisect.bisect_left(state.times, time_s)
        near = [state.times[j] for j in (i - 1, i) if 0 <= j < len(state.times)]
        best = min(near, key=lambda t: abs(t - time_s))
        return best if abs(best - time_s) <= tolerance_s else None

    def turn_end(self, conversation: str, now: float, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 signal: float = 0.0) -> np.ndarray:
        """The turn of `conversation` that arrived at arrival_s ended at
        `now`: its feature row, float64 (len(names()),). A turn whose arrival
        was never fed is entered into its conversation's history (not into
        the cluster windows)."""
        now = self.advance(now)
        state = self._touch(conversation)
        pos = bisect.bisect_right(state.times, arrival_s) - 1
        if pos < 0 or state.times[pos] != arrival_s:
            pos += 1
            state.times.insert(pos, arrival_s)
            state.prompts.insert(pos, int(prompt_tokens))
            if pos == 0 and state.dropped == 0:
                state.first_s = arrival_s
            pos -= self._trim(state, pos)  # never drops the inserted one: over the cap until the next arrival
        index = state.dropped + pos
        if pos >= 1:
            gap = arrival_s - state.times[pos - 1]
            growth = float(prompt_tokens - state.prompts[pos - 1])
        else:
            gap = growth = NAN
        mean_gap = (arrival_s - state.first_s) / index if index > 0 else NAN
        later = state.times[pos + 1] if pos + 1 < len(state.times) else None
        end = _End(now, later)
        for pending in self._pending:
            pending.append(end)
        if later is None:
            state.last_end = end
        row = [float(index), float(prompt_tokens), float(output_tokens), growth, gap, mean_gap,
               now - state.first_s, now - arrival_s,
               *(len(times) / window for window, times in zip(self.spec.rate_windows_s, self._rate_windows)),
               float(len(self._active_count)),
               *(self._returned[i] / len(r) if r else NAN for i, r in enumerate(self._resolved)),
               float(signal)]
        return np.asarray(row, dtype=np.float64)

    def _touch(self, conversation: str) -> _Conversation:
        state = self._conversations.get(conversation)
        if state is None:
            state = self._conversations[conversation] = _Conversation()
            while len(self._conversations) > self.spec.max_conversations:
                self._conversations.popitem(last=False)
        else:
            self._conversations.move_to_end(conversation)
        return state

    def _trim(self, state: _Conversation, most: int | None = None) -> int:
        """Keeps the last turn_cap arrivals, dropping at most `most`;
        returns how many were dropped."""
        over = max(0, len(state.times) - self.spec.turn_cap)
        over = over if most is None else min(over, most)
        if over:
            del state.times[:over], state.prompts[:over]
            state.dropped += over
        return over
