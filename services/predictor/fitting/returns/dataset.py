"""Offline rows: every turn end's features (through the online builder), its
return delay, and the masks that say which labels are known.

Labels. For horizon t, a row's label is "the conversation's next turn
arrived within t of this turn's end": delay_s <= t, delay_s = next arrival -
end_s (+inf when no next turn is in the data).

Censoring. The label is known only once its window [end_s, end_s + t] lies
inside the data: `known(until_s)[:, i]` = end_s + t_i <= until_s. Training
passes until_s = the start of the evaluated slice, so no arrival of that
slice decides a training label; evaluation passes the end of the data.
Dropping every row whose window is open (returned or not) keeps the base
rate unbiased; keeping the early returns alone would inflate it.

Overlapped turns (the next turn arrived at or before this one's end, see
turns.TurnRecord.overlapped) are fed to the builder like every turn but get
no row: at their end there is nothing left to forecast. The live tracker
skips them the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from speckv.services.predictor.fitting.returns.turns import TurnRecord
from speckv.services.predictor.serving.returns.features import ReturnFeatures, ReturnFeatureSpec

_ARRIVAL, _END = 0, 1


@dataclass(frozen=True, slots=True)
class ReturnRows:
    """One row per (non-overlapped) turn end, sorted by end_s. X is float64
    (N, len(names)); delay_s is seconds (+inf: no next turn in the data)."""

    X: np.ndarray
    names: tuple[str, ...]
    conversation: np.ndarray  # object (N,)
    turn_index: np.ndarray  # int64 (N,)
    arrival_s: np.ndarray  # float64 (N,)
    end_s: np.ndarray  # float64 (N,)
    delay_s: np.ndarray  # float64 (N,)

    def __len__(self) -> int:
        return len(self.end_s)

    def take(self, index: np.ndarray) -> "ReturnRows":
        return ReturnRows(self.X[index], self.names, self.conversation[index], self.turn_index[index],
                          self.arrival_s[index], self.end_s[index], self.delay_s[index])

    def column(self, name: str) -> np.ndarray:
        return self.X[:, self.names.index(name)]

    def labels(self, horizons_s: Sequence[float]) -> np.ndarray:
        """bool (N, H): returned within each horizon of the end."""
        return self.delay_s[:, None] <= np.asarray(horizons_s, dtype=np.float64)[None, :]

    def known(self, horizons_s: Sequence[float], until_s: float) -> np.ndarray:
        """bool (N, H): the horizon window closed by until_s (label decided
        by data at or before until_s)."""
        return self.end_s[:, None] + np.asarray(horizons_s, dtype=np.float64)[None, :] <= until_s


def build_rows(turns: Sequence[TurnRecord], spec: ReturnFeatureSpec,
               signal: Callable[[TurnRecord], float] | None = None) -> ReturnRows:
    """Replays every turn's arrival and end, in time order (an arrival
    before an end at the same time), through one ReturnFeatures and keeps the
    row of each non-overlapped turn end. signal(turn) feeds the signal
    column; without it, the turn's announced follow_ups do (0 in the public
    traces), as the served tracker's are fed from TurnEnd.follow_ups."""
    events: list[tuple[float, int, str, int, int]] = []
    for k, turn in enumerate(turns):
        events.append((turn.arrival_s, _ARRIVAL, turn.conversation, turn.turn_index, k))
        events.append((turn.end_s, _END, turn.conversation, turn.turn_index, k))
    events.sort()
    builder = ReturnFeatures(spec)
    rows: dict[int, np.ndarray] = {}
    for time_s, kind, conversation, _, k in events:
        turn = turns[k]
        if kind == _ARRIVAL:
            builder.arrival(conversation, time_s, turn.prompt_tokens)
            continue
        row = builder.turn_end(conversation, time_s, turn.arrival_s, turn.prompt_tokens, turn.output_tokens,
                               float(turn.follow_ups) if signal is None else float(signal(turn)))
        if not turn.overlapped:
            rows[k] = row
    order = sorted(rows, key=lambda k: (turns[k].end_s, turns[k].arrival_s, turns[k].conversation))
    names = spec.names()
    X = np.stack([rows[k] for k in order]) if order else np.zeros((0, len(names)))
    picked = [turns[k] for k in order]
    return ReturnRows(X, names, np.array([t.conversation for t in picked], dtype=object),
                      np.array([t.turn_index for t in picked], dtype=np.int64),
                      np.array([t.arrival_s for t in picked], dtype=np.float64),
                      np.array([t.end_s for t in picked], dtype=np.float64),
                      np.array([t.return_delay_s for t in picked], dtype=np.float64))


@dataclass(frozen=True, slots=True)
class Split:
    """Chronological split on trace time (seconds): rows ending before
    eval_start_s train (labels censored at eval_start_s), rows ending at or
    after it are evaluated (labels censored at data_end_s)."""

    data_start_s: float
    data_end_s: float
    eval_start_s: float

    @classmethod
    def of(cls, data_start_s: float, data_end_s: float, eval_fraction: float) -> "Split":
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"eval_fraction={eval_fraction}: must be in (0, 1)")
        return cls(data_start_s, data_end_s, data_end_s - eval_fraction * (data_end_s - data_start_s))

    def train(self, rows: ReturnRows) -> ReturnRows:
        return rows.take(np.flatnonzero(rows.end_s < self.eval_start_s))

    def evaluated(self, rows: ReturnRows) -> ReturnRows:
        return rows.take(np.flatnonzero(rows.end_s >= self.eval_start_s))
