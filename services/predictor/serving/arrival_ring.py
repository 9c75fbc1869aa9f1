"""Per-family arrival counts on a fixed time step, many families in one NumPy ring.

Layout: `counts[row, step % W]` holds the arrivals of the family in `row`
during absolute step `step = floor(time_s / step_s)`, for the W steps that end
at `head`, the newest step any accepted observation fell in. `total[step % W]`
is the cluster-wide count of the same step.

Invariants:
- a column that does not hold a step in (head - W, head] is zero in every row
  and in `total` (columns are zeroed as the head moves past them);
- a row that no family owns is all zero, so a freed row is reusable as is;
- a tracked family has at least one arrival in (head - W, head]: a family idle
  for a whole window is forgotten (its row freed) when the head moves on;
- with max_families > 0, at most max_families families are tracked: a new
  family past the cap first evicts the least recently seen one (the family
  whose latest observation came first, in the order observed, late ones
  included), exactly one, so the table holds max_families after it. An
  evicted family's counts leave its row and its log entries count zero, so a
  row handed out again starts from zero; the cluster total keeps its
  arrivals (they did happen).

Time comes only from observations: the series never reads a clock. An
observation in a step the head has passed but the window still holds
(late-but-in-window) is counted in its own step; one from before the window
is rejected as TOO_OLD, because its step's column now holds a newer step.

Cost: O(1) per observation, an eviction at the cap included (the families
are kept in an OrderedDict in the order last seen: move_to_end per
observation, popitem for the least recent; an evicted row's log entries are
zeroed lazily, in one vectorised pass by the next read of the log, which
scans the log anyway); when the head moves on, O(families) per step crossed
(zeroing the columns that leave the window, dropping idle families).
Memory: capacity * W * 4 bytes; rows grow by doubling. Counts are float32,
exact up to 2**24 arrivals per family per step.

Weighted sums (counts @ weights, the EWMA rates' numerator) run over the
arrival log instead of the ring: one (row, step, count) entry per accepted
observation, in the order observed, entries whose step left the window
skipped. np.bincount adds each row's entries in float64, in log order, so
the cost is the arrivals in the window, not rows x W (at 256 simulated nodes
about 64k entries against a 16k x 300 ring), and a row's sum has the same
bits whichever rows are asked. The sums of every row are kept until the
counts change (`version`), so asking again with the same weights is free.
"""
from __future__ import annotations

import enum
import math
from collections import OrderedDict
from typing import Sequence

import numpy as np

from speckv.services.common.ids import Family

INITIAL_ROWS = 64
INITIAL_LOG = 1024
RING_PRODUCTS_KEPT = 4  # whole-ring products kept per version (one per weight vector: the rate half-lives)
NO_STEP = -(1 << 63)  # np.iinfo(np.int64).min, written out: a row handed out has seen no arrival yet


class ArrivalPlacement(enum.Enum):
    COUNTED = "counted"  # in the head step or a newer one
    COUNTED_LATE = "counted_late"  # in an older step the window still holds
    TOO_OLD = "too_old"  # before the window: not counted


class ArrivalSeries:
    """The ring of counts. Not thread-safe: the core serialises access."""

    def __init__(self, step_s: float, window_steps: int, initial_rows: int = INITIAL_ROWS,
                 max_families: int = 0) -> None:
        """max_families: most families tracked at once (0: no cap)."""
        if not (math.isfinite(step_s) and step_s > 0):
            raise ValueError(f"step_s={step_s}: must be finite and > 0")
        if window_steps < 2:
            raise ValueError(f"window_steps={window_steps}: need at least 2")
        if max_families < 0:
            raise ValueError(f"max_families={max_families}: must be >= 0")
        self.max_families = int(max_families)
        self.evicted = 0  # families dropped at the cap since start
        self.step_s = float(step_s)
        self.window_steps = int(window_steps)
        capacity = max(1, initial_rows)
        self._counts = np.zeros((capacity, self.window_steps), dtype=np.float32)
        self._last_step = np.zeros(capacity, dtype=np.int64)  # newest step with an arrival, per row
        self._serial = np.zeros(capacity, dtype=np.int64)  # bumped whenever a row is handed to a family
        self._serials_issued = 0
        self._total = np.zeros(self.window_steps, dtype=np.float32)
        self._row_of: OrderedDict[str, int] = OrderedDict()  # least recently seen first
        self._family_of = np.full(capacity, None, dtype=object)  # an array: names of many rows in one gather
        self._owned = np.zeros(capacity, dtype=bool)
        self._free: list[int] = list(range(capacity - 1, -1, -1))  # pop() hands out low rows first
        self._head: int | None = None
        self._origin: int | None = None  # oldest step ever counted: history starts here
        self._latest_time_s = 0.0
        self._version = 0  # bumped by every change to the counts, the head or the rows
        self._tracked_rows: np.ndarray | None = None  # cache of the owned rows, dropped when ownership changes
        # Per row, the log index below which its entries belong to a family
        # evicted at the cap (-1: none): zeroed by the next read of the log
        # (_purge_evicted), not at eviction, so an eviction costs O(W), not O(log).
        self._evicted_before = np.full(capacity, -1, dtype=np.int64)
        self._evictions_pending = False
        self._products: dict[bytes, np.ndarray] = {}  # weighted sums of every row at _products_version
        self._products_version = -1
        # The arrival log: entries [_log_start, _log_len) of four parallel
        # arrays (row, absolute step, its ring column, count); those before
        # _log_start have left the window. A late observation's entry sits
        # among newer ones, so a few stale entries may remain past
        # _log_start: readers skip steps outside the window. The column is
        # kept, not recomputed, because every forecast gathers weights by it.
        self._log_rows = np.zeros(INITIAL_LOG, dtype=np.int64)
        self._log_steps = np.zeros(INITIAL_LOG, dtype=np.int64)
        self._log_cols = np.zeros(INITIAL_LOG, dtype=np.int64)
        self._log_counts = np.zeros(INITIAL_LOG, dtype=np.float64)
        self._log_start = 0
        self._log_len = 0
        # What lets a product skip work over the whole log, bit for bit: with
        # the steps in order, trimming at the head leaves no stale entry (no
        # mask); with every count 1.0, w[col] * count is w[col] (no multiply).
        # Late observations and other counts clear them until a compaction.
        self._log_in_order = True
        self._log_unit_counts = True
        self._log_max_step = NO_STEP

    # --- reading -------------------------------------------------------------

    @property
    def head_step(self) -> int | None:
        """Newest step with a counted observation; None before the first."""
        return self._head

    @property
    def origin_step(self) -> int | None:
        """Oldest step ever counted; steps before it were never observed."""
        return self._origin

    @property
    def latest_time_s(self) -> float:
        """Largest observation time counted so far (0.0 before the first)."""
        return self._latest_time_s

    @property
    def families_tracked(self) -> int:
        return len(self._row_of)

    @property
    def version(self) -> int:
        """Changes whenever anything a read returns may have changed (an
        accepted observation, the head moving, rows growing). Equal versions
        of one series: equal counts, head, origin and rows."""
        return self._version

    @property
    def capacity(self) -> int:
        return self._counts.shape[0]

    def step_of(self, time_s: float) -> int:
        return math.floor(time_s / self.step_s)

    def row_of(self, family: str) -> int:
        """The family's row, or -1 when it is not tracked."""
        return self._row_of.get(family, -1)

    def rows_of(self, families: Sequence[str]) -> np.ndarray:
        get = self._row_of.get
        return np.fromiter((get(f, -1) for f in families), dtype=np.int64, count=len(families))

    def tracked(self) -> tuple[list[Family], np.ndarray]:
        """Every tracked family and its row, in row order."""
        rows = self.tracked_rows()
        return self.families_at(rows), rows

    def tracked_rows(self) -> np.ndarray:
        """The rows of every tracked family, ascending (int64, read-only;
        rebuilt only after a family is added or forgotten)."""
        if self._tracked_rows is None:
            rows = np.flatnonzero(self._owned).astype(np.int64)
            rows.flags.writeable = False
            self._tracked_rows = rows
        return self._tracked_rows

    def families_at(self, rows: np.ndarray) -> list[Family]:
        """The family of each row; rows must be tracked."""
        return self._family_of[np.asarray(rows, dtype=np.int64)].tolist()

    def column_steps(self) -> np.ndarray:
        """Absolute step held by each ring column (int64, shape (W,)); only
        meaningful for columns in (head - W, head]. Empty series: all -1."""
        cols = np.arange(self.window_steps, dtype=np.int64)
        if self._head is None:
            return np.full(self.window_steps, -1, dtype=np.int64)
        return self._head - ((self._head - cols) % self.window_steps)

    def weighted_sums(self, rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """counts[rows] @ weights as float64, shape (len(rows),), summed in
        float64 over the arrival log (module docstring): a row's value does
        not depend on the other rows asked. rows must be valid (>= 0);
        weights has one float per column."""
        return self._ring_product(np.ascontiguousarray(weights, dtype=np.float64))[rows]

    def _ring_product(self, w: np.ndarray) -> np.ndarray:
        """counts @ w for every row, kept until the counts change: the
        scheduler tick and the forecast poll often ask at the same instant."""
        if self._products_version != self._version:
            self._products.clear()
            self._products_version = self._version
        key = w.tobytes()  # W float64: a few KiB
        product = self._products.get(key)
        if product is None:
            if len(self._products) >= RING_PRODUCTS_KEPT:
                self._products.clear()
            product = self._log_product(w)
            product.flags.writeable = False
            self._products[key] = product
        return product

    def _log_product(self, w: np.ndarray) -> np.ndarray:
        self._purge_evicted()
        start, end = self._log_start, self._log_len
        rows, cols, counts = self._log_rows[start:end], self._log_cols[start:end], self._log_counts[start:end]
        if self._head is not None and not self._log_in_order:
            held = self._log_steps[start:end] > self._head - self.window_steps
            if not held.all():
                rows, cols, counts = rows[held], cols[held], counts[held]
        weights = w[cols] if self._log_unit_counts else w[cols] * counts
        return np.bincount(rows, weights=weights, minlength=self.capacity)

    def weighted_total(self, weights: np.ndarray) -> float:
        return float(self._total.astype(np.float64) @ np.asarray(weights, dtype=np.float64))

    def count_in_step(self, rows: np.ndarray, step: int) -> tuple[np.ndarray, float]:
        """Arrivals of rows in one absolute step, and the cluster total;
        zeros when the window does not hold that step."""
        if self._head is None or not (self._head - self.window_steps < step <= self._head):
            return np.zeros(len(rows), dtype=np.float64), 0.0
        col = step % self.window_steps
        return self._counts[rows, col].astype(np.float64), float(self._total[col])

    @property
    def row_serials(self) -> np.ndarray:
        """Per row, a number that changes whenever the row gets a new family
        (so state kept per row elsewhere knows when to forget it)."""
        return self._serial

    def column(self, step: int) -> tuple[np.ndarray, float]:
        """Every row's arrivals in one absolute step (float64, capacity
        long) and the cluster total; zeros when the window does not hold it."""
        if self._head is None or not (self._head - self.window_steps < step <= self._head):
            return np.zeros(self.capacity, dtype=np.float64), 0.0
        col = step % self.window_steps
        return self._counts[:, col].astype(np.float64), float(self._total[col])

    def snapshot(self) -> tuple[list[str], np.ndarray, int]:
        """(families, counts (families, W) oldest step first, first step):
        a copy of the window for training off the lock."""
        if self._head is None:
            return [], np.zeros((0, self.window_steps), dtype=np.float32), 0
        families, rows = self.tracked()
        first = self._head - self.window_steps + 1
        order = (np.arange(first, self._head + 1) % self.window_steps)
        return [str(f) for f in families], self._counts[rows][:, order].copy(), first

    # --- writing -------------------------------------------------------------

    def add(self, family: str, time_s: float, count: float = 1.0) -> ArrivalPlacement:
        """Counts `count` arrivals of family at time_s (finite, >= 0: the
        caller validates). Moves the head on when time_s is in a newer step."""
        step = self.step_of(time_s)
        if self._head is None or step > self._head:
            self._advance(step)
            placement = ArrivalPlacement.COUNTED
        elif step <= self._head - self.window_steps:
            return ArrivalPlacement.TOO_OLD
        else:
            placement = ArrivalPlacement.COUNTED if step == self._head else ArrivalPlacement.COUNTED_LATE
        self._version += 1
        row = self._row_of.get(family)
        if row is None:
            row = self._take_row(family)
        else:
            self._row_of.move_to_end(family)  # now the most recently seen
        col = step % self.window_steps
        self._counts[row, col] += count
        self._total[col] += count
        self._log(row, step, col, count)
        if step > self._last_step[row]:
            self._last_step[row] = step
        self._origin = step if self._origin is None else min(self._origin, step)
        self._latest_time_s = max(self._latest_time_s, time_s)
        return placement

    def _advance(self, step: int) -> None:
        """Moves the head to step: zeroes the columns of the steps that leave
        the window and forgets families with no arrival left in it."""
        if self._head is not None:
            crossed = step - self._head
            if crossed >= self.window_steps:
                self._counts.fill(0.0)
                self._total.fill(0.0)
            else:
                cols = np.arange(self._head + 1, step + 1, dtype=np.int64) % self.window_steps
                self._counts[:, cols] = 0.0
                self._total[cols] = 0.0
        self._head = step
        self._trim_log(step - self.window_steps)
        self._forget_idle(step - self.window_steps)

    def _log(self, row: int, step: int, col: int, count: float) -> None:
        if self._log_len == len(self._log_rows):
            self._compact_log()
        i = self._log_len
        self._log_rows[i], self._log_steps[i], self._log_cols[i], self._log_counts[i] = row, step, col, count
        self._log_len = i + 1
        if step < self._log_max_step:
            self._log_in_order = False
        else:
            self._log_max_step = step
        if count != 1.0:
            self._log_unit_counts = False

    def _trim_log(self, cutoff_step: int) -> None:
        """Drops the leading entries at or before cutoff_step (they left the window)."""
        start, end, steps = self._log_start, self._log_len, self._log_steps
        while start < end and steps[start] <= cutoff_step:
            start += 1
        self._log_start = start

    def _compact_log(self) -> None:
        """Moves the entries still in the window to the front; doubles the
        arrays when they stay more than half full."""
        self._purge_evicted()  # indices move: settle the evicted entries first
        start, end = self._log_start, self._log_len
        keep = slice(start, end)
        arrays = (self._log_rows, self._log_steps, self._log_cols, self._log_counts)
        if self._head is not None:
            held = self._log_steps[keep] > self._head - self.window_steps
            rows, steps, cols, counts = (a[keep][held] for a in arrays)
        else:
            rows, steps, cols, counts = (a[keep].copy() for a in arrays)
        size = len(self._log_rows) * (2 if 2 * len(rows) > len(self._log_rows) else 1)
        self._log_rows = np.zeros(size, dtype=np.int64)
        self._log_steps = np.zeros(size, dtype=np.int64)
        self._log_cols = np.zeros(size, dtype=np.int64)
        self._log_counts = np.zeros(size, dtype=np.float64)
        n = len(rows)
        self._log_rows[:n], self._log_steps[:n], self._log_cols[:n], self._log_counts[:n] = rows, steps, cols, counts
        self._log_start, self._log_len = 0, n
        self._log_in_order = n < 2 or bool(np.all(steps[1:] >= steps[:-1]))
        self._log_unit_counts = bool(np.all(counts == 1.0))

    def _forget_idle(self, cutoff_step: int) -> None:
        """Frees rows whose newest arrival is at or before cutoff_step (all
        their counts have left the window, so the rows are already zero)."""
        if not self._row_of:
            return
        idle = np.flatnonzero((self._last_step <= cutoff_step) & self._owned)
        if not len(idle):
            return
        for row in idle.tolist():
            del self._row_of[self._family_of[row]]
            self._free.append(row)
        self._family_of[idle] = None
        self._owned[idle] = False
        self._tracked_rows = None

    def _evict_least_recent(self) -> None:
        """Drops the least recently seen family to make room under the cap, in
        O(W): its window counts are zeroed now; its log entries are marked
        (every entry of its row logged so far) and zeroed by the next read of
        the log, before the row's next family can be summed with them."""
        family, row = self._row_of.popitem(last=False)
        self._counts[row] = 0.0
        self._evicted_before[row] = self._log_len
        self._evictions_pending = True
        self._free.append(row)
        self._family_of[row] = None
        self._owned[row] = False
        self._tracked_rows = None
        self.evicted += 1
        self._version += 1

    def _purge_evicted(self) -> None:
        """Zeroes the log entries of families evicted since the last purge
        (one vectorised pass over the log; the entries a row's later family
        logged are kept, being at or past the mark)."""
        if not self._evictions_pending:
            return
        start, end = self._log_start, self._log_len
        index = np.arange(start, end, dtype=np.int64)
        dead = index < self._evicted_before[self._log_rows[start:end]]
        if dead.any():
            self._log_counts[start:end][dead] = 0.0
            self._log_unit_counts = False
        self._evicted_before.fill(-1)
        self._evictions_pending = False

    def _take_row(self, family: str) -> int:
        if self.max_families and len(self._row_of) >= self.max_families:
            self._evict_least_recent()
        if not self._free:
            self._grow()
        row = self._free.pop()
        self._row_of[family] = row
        self._family_of[row] = family
        self._owned[row] = True
        self._tracked_rows = None
        self._last_step[row] = NO_STEP
        self._serials_issued += 1
        self._serial[row] = self._serials_issued
        return row

    def _grow(self) -> None:
        old = self.capacity
        new = old * 2
        counts = np.zeros((new, self.window_steps), dtype=np.float32)
        counts[:old] = self._counts
        last = np.zeros(new, dtype=np.int64)
        last[:old] = self._last_step
        serial = np.zeros(new, dtype=np.int64)
        serial[:old] = self._serial
        evicted_before = np.full(new, -1, dtype=np.int64)
        evicted_before[:old] = self._evicted_before
        self._evicted_before = evicted_before
        self._counts, self._last_step, self._serial = counts, last, serial
        self._family_of = np.concatenate([self._family_of, np.full(new - old, None, dtype=object)])
        self._owned = np.concatenate([self._owned, np.zeros(new - old, dtype=bool)])
        self._free.extend(range(new - 1, old - 1, -1))
