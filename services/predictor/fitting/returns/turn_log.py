"""TurnLog: the traffic a return model learns from online, bounded.

Fed what the served tracker is fed, in any order within a conversation:
arrival(conversation, time_s, prompt_tokens) per request and turn_end(
conversation, end_s, arrival_s, ...) per completed turn (seconds, the
caller's clock; the log reads no clock). turns(now) turns them into the
TurnRecords offline training reads (turns.py): a turn's next_arrival_s is
the conversation's first arrival after the turn's own (so a return is
learned the moment it is seen, whether or not its own turn has ended),
turn_index counts the conversation's arrivals the log still holds before it
(left truncation at the window, as in a trace).

Bounds: turn ends and arrivals older than window_s before the newest time
seen are dropped (prune, called on every append past a step); at most
max_turn_ends turn ends are held (the oldest dropped first), and a
conversation keeps at most MAX_ARRIVALS_PER_CONVERSATION arrivals. Not
thread-safe: the fitter that owns it locks around it.
"""
from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

from speckv.services.predictor.fitting.returns.turns import TurnRecord

MAX_ARRIVALS_PER_CONVERSATION = 4096
PRUNE_EVERY = 1024  # appends between prunes: pruning is O(what it drops), amortised


@dataclass(frozen=True, slots=True)
class LoggedEnd:
    """One completed turn as reported. Seconds; end_s >= arrival_s."""

    conversation: str
    arrival_s: float
    end_s: float
    prompt_tokens: int
    output_tokens: int
    follow_ups: int


class TurnLog:
    def __init__(self, window_s: float, max_turn_ends: int) -> None:
        if not (math.isfinite(window_s) and window_s > 0) or max_turn_ends < 1:
            raise ValueError(f"window_s={window_s}, max_turn_ends={max_turn_ends}: must be > 0 and >= 1")
        self.window_s = window_s
        self.max_turn_ends = max_turn_ends
        self._ends: deque[LoggedEnd] = deque()
        self._arrivals: dict[str, list[float]] = {}  # sorted arrival times per conversation
        self._prompts: dict[tuple[str, float], int] = {}
        self._ended: set[tuple[str, float]] = set()  # arrivals whose turn end was seen (held or dropped by the cap)
        self._newest = -math.inf
        self._appends = 0
        self.turn_ends_total = 0
        self.arrivals_total = 0

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def newest_s(self) -> float:
        return self._newest

    @property
    def oldest_end_s(self) -> float:
        return self._ends[0].end_s if self._ends else math.inf

    def arrival(self, conversation: str, time_s: float, prompt_tokens: int = 0) -> None:
        times = self._arrivals.setdefault(conversation, [])
        at = bisect.bisect_left(times, time_s)
        if at < len(times) and times[at] == time_s:
            return  # the same arrival reported again
        times.insert(at, time_s)
        if len(times) > MAX_ARRIVALS_PER_CONVERSATION:
            dropped = (conversation, times.pop(0))
            self._prompts.pop(dropped, None)
            self._ended.discard(dropped)
        self._prompts[(conversation, time_s)] = int(prompt_tokens)
        self.arrivals_total += 1
        self._advance(time_s)

    def turn_end(self, conversation: str, end_s: float, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 follow_ups: int = 0) -> None:
        if conversation not in self._arrivals or arrival_s not in self._arrivals[conversation]:
            self.arrival(conversation, arrival_s, prompt_tokens)
        self._ended.add((conversation, arrival_s))
        self._ends.append(LoggedEnd(conversation, arrival_s, max(end_s, arrival_s), int(prompt_tokens),
                                    int(output_tokens), int(follow_ups)))
        while len(self._ends) > self.max_turn_ends:
            self._ends.popleft()
        self.turn_ends_total += 1
        self._advance(end_s)

    def turns(self) -> list[TurnRecord]:
        """Every held turn end as a TurnRecord, sorted as build_turns sorts."""
        out: list[TurnRecord] = []
        for end in self._ends:
            times = self._arrivals.get(end.conversation, [])
            index = bisect.bisect_left(times, end.arrival_s)
            following = times[index + 1] if index + 1 < len(times) else None
            out.append(TurnRecord(end.conversation, index, end.arrival_s, end.end_s, end.prompt_tokens,
                                  end.output_tokens, following, end.follow_ups))
        out.sort(key=lambda t: (t.end_s, t.arrival_s, t.conversation, t.turn_index))
        return out

    def arrivals_without_end(self) -> list[tuple[str, float, int]]:
        """(conversation, time_s, prompt_tokens) of held arrivals no held turn end
        names: requests still in flight (a tracker warmed from the log sees them)."""
        return sorted(((c, t, self._prompts.get((c, t), 0)) for c, times in self._arrivals.items() for t in times
                       if (c, t) not in self._ended), key=lambda a: (a[1], a[0]))

    def _advance(self, time_s: float) -> None:
        if time_s > self._newest:
            self._newest = time_s
        self._appends += 1
        if self._appends % PRUNE_EVERY == 0:
            self.prune()

    def prune(self) -> None:
        """Drops what fell out of the window (module docstring)."""
        cut = self._newest - self.window_s
        while self._ends and self._ends[0].end_s < cut:
            self._ends.popleft()
        for conversation in list(self._arrivals):
            times = self._arrivals[conversation]
            keep = bisect.bisect_left(times, cut)
            for t in times[:keep]:
                self._prompts.pop((conversation, t), None)
                self._ended.discard((conversation, t))
            if keep == len(times):
                del self._arrivals[conversation]
            elif keep:
                del times[:keep]
