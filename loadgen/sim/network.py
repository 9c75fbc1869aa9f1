"""Network model: every node has one full-duplex link (an egress and an
ingress side, each `gbps`); a transfer from A to B occupies A's egress and
B's ingress for its whole duration.

Algorithm (processor sharing with a bottleneck share):
- A transfer first waits `overhead_ms` (per-transfer latency: setup, first
  byte; it occupies no bandwidth), then its bytes flow.
- While flowing, a transfer's rate is min(egress(A) / n_out(A),
  ingress(B) / n_in(B)): each side splits its bandwidth equally among the
  transfers flowing through it, and a transfer goes at its tighter share.
  (Not fully work-conserving: a transfer held back by its other end leaves
  part of its share unused; max-min fair progressive filling would hand
  that on. The equal split is what matters for bursts of copies and pulls
  into or out of one hot node, and it keeps every update local.)
- A transfer starting or finishing changes the counts of its two sides
  only, so only the transfers through those sides are re-rated: their bytes
  sent so far are banked at the old rate, and their completion events are
  rescheduled at the new one.

With a link to itself alone a transfer of n bytes takes exactly
LinkModel.transfer_ms(n) = overhead_ms + 8 n / (gbps 1e9) s, the live
cluster's link model, so an uncontended simulated pull costs what the
router expects. Times are virtual seconds, sizes real-model bytes.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from typing import Callable

from speckv.loadgen.sim.event_loop import EventHandle, EventQueue
from speckv.services.common.engine_profile import LinkModel

# Transfers finishing within this many bytes count as done (float rounding).
_EPS_BYTES = 1e-6


@dataclass(slots=True)
class Transfer:
    transfer_id: int
    source: str
    target: str
    nbytes: int
    on_done: Callable[["Transfer"], None]
    started_s: float
    flowing_s: float | None = None  # when its bytes began to flow
    finished_s: float | None = None
    remaining: float = 0.0  # bytes still to send, as of `since`
    rate: float = 0.0  # bytes per second, as of `since`
    since: float = 0.0
    handle: EventHandle | None = None


@dataclass(slots=True)
class LinkStats:
    transfers: int = 0
    bytes: int = 0


class Network:
    def __init__(self, queue: EventQueue, link: LinkModel) -> None:
        self._queue = queue
        self._bytes_per_s = link.gbps * 1e9 / 8.0
        self._overhead_s = link.overhead_ms / 1e3
        self._out: dict[str, set[int]] = defaultdict(set)
        self._in: dict[str, set[int]] = defaultdict(set)
        self._flowing: dict[int, Transfer] = {}
        self._ids = itertools.count(1)
        self.stats: dict[str, LinkStats] = defaultdict(LinkStats)  # per source node
        self.bytes_total = 0

    @property
    def bytes_per_s(self) -> float:
        return self._bytes_per_s

    def start(self, source: str, target: str, nbytes: int, on_done: Callable[[Transfer], None]) -> Transfer:
        """Starts a transfer now; on_done(transfer) runs when its last byte lands."""
        if source == target:
            raise ValueError(f"a transfer needs two nodes (got {source!r} twice)")
        if nbytes < 0:
            raise ValueError(f"nbytes={nbytes}: must be >= 0")
        t = Transfer(next(self._ids), source, target, nbytes, on_done, self._queue.now(), remaining=float(nbytes))
        self._queue.after(self._overhead_s, lambda: self._begin_flow(t))
        return t

    def active(self, node: str) -> tuple[int, int]:
        """(flowing out of, flowing into) node now."""
        return len(self._out[node]), len(self._in[node])

    def _begin_flow(self, t: Transfer) -> None:
        now = self._queue.now()
        t.flowing_s, t.since = now, now
        self._flowing[t.transfer_id] = t
        affected = self._out[t.source] | self._in[t.target]
        self._out[t.source].add(t.transfer_id)
        self._in[t.target].add(t.transfer_id)
        self._rerate(affected | {t.transfer_id}, now)

    def _finish(self, t: Transfer) -> None:
        now = self._queue.now()
        del self._flowing[t.transfer_id]
        self._out[t.source].discard(t.transfer_id)
        self._in[t.target].discard(t.transfer_id)
        t.finished_s, t.remaining = now, 0.0
        self.stats[t.source].transfers += 1
        self.stats[t.source].bytes += t.nbytes
        self.bytes_total += t.nbytes
        self._rerate(self._out[t.source] | self._in[t.target], now)
        t.on_done(t)

    def _rerate(self, ids: set[int], now: float) -> None:
        for tid in ids:
            t = self._flowing[tid]
            t.remaining = max(0.0, t.remaining - t.rate * (now - t.since))
            t.since = now
            t.rate = min(self._bytes_per_s / len(self._out[t.source]), self._bytes_per_s / len(self._in[t.target]))
            if t.handle is not None:
                t.handle.cancel()
            delay = 0.0 if t.remaining <= _EPS_BYTES else t.remaining / t.rate
            t.handle = self._queue.after(delay, partial(self._finish, t))
