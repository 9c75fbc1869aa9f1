"""Which data plane carried the committed copies between each pair of nodes
(issue 42: `speckv status` says which transport carried each transfer).

The source's agent reports the transport its kvstore used with the order's
COMMITTED (OrderStatusReport.transport: shm, nixl, tcp or grpc). The tally
counts committed copy orders and their bytes per (source, target,
transport), cumulative over the scheduler's durable state (a restart or a
replica's take-over restores it from the journal; without one, since the
scheduler started); a copy committed without
a report counts under "" until its source's late COMMITTED names the
transport (the scheduler may see the blocks in the target's KV events
first; that report is then an idempotent repeat that only labels). Pure: no
clock, no I/O but its journal's. Not thread-safe: SchedulerCore serialises
access.

Journal: each change hands the journal the absolute counts of the rows it
changed (a row of 0 orders is gone) BEFORE the tally changes, so a write that
raises (Unavailable) changes neither: memory and the durable state never
disagree about a copy, and absolute rows make a repeated write harmless.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from speckv.services.common.errors import InvalidArgument

MAX_TRANSPORT_CHARS = 32
_NAME = re.compile(r"[a-z0-9_-]*")


def check_transport(transport: str) -> str:
    """transport as reported, or InvalidArgument: at most MAX_TRANSPORT_CHARS
    of lower-case letters, digits, '-' and '_' (a newer kvstore may name a
    transport this scheduler does not know; it is counted as it is named)."""
    if len(transport) > MAX_TRANSPORT_CHARS or not _NAME.fullmatch(transport):
        raise InvalidArgument(f"transport={transport[:MAX_TRANSPORT_CHARS]!r}: at most {MAX_TRANSPORT_CHARS} "
                              "characters of a-z, 0-9, '-' and '_'")
    return transport


@dataclass(frozen=True, slots=True)
class Carried:
    """What one transport carried from source to target: orders, bytes."""

    source: str
    target: str
    transport: str
    orders: int
    bytes: int


class TransportJournal(Protocol):
    """Where a TransportTally records its changes (the scheduler's state store)."""

    def transports_counted(self, rows: Sequence[Carried]) -> None:
        """rows: the new absolute counts of each (source, target, transport)
        that changed, in one transaction; a row of 0 orders is deleted.
        Raising changes nothing."""
        ...


_Key = tuple[str, str, str]


class TransportTally:
    def __init__(self, journal: TransportJournal | None = None) -> None:
        self._counts: dict[_Key, tuple[int, int]] = {}  # (orders, bytes)
        self.journal = journal  # None: in memory only

    def add(self, source: str, target: str, transport: str, nbytes: int) -> None:
        """One committed copy of nbytes bytes."""
        n, b = self._counts.get((source, target, transport), (0, 0))
        self._apply({(source, target, transport): (n + 1, b + max(0, nbytes))})

    def relabel(self, source: str, target: str, transport: str, nbytes: int) -> None:
        """A copy counted under "" (committed from the target's KV events
        before its source's report) moves to the transport reported late."""
        unlabelled = self._counts.get((source, target, ""))
        if unlabelled is None:
            return
        n, b = self._counts.get((source, target, transport), (0, 0))
        self._apply({(source, target, ""): (unlabelled[0] - 1, max(0, unlabelled[1] - max(0, nbytes))),
                     (source, target, transport): (n + 1, b + max(0, nbytes))})

    def restore(self, rows: Iterable[Carried]) -> None:
        """Replaces every count with rows (what the journal saved), journaling
        nothing; rows of no orders are skipped."""
        self._counts = {(r.source, r.target, r.transport): (r.orders, max(0, r.bytes)) for r in rows if r.orders > 0}

    def rows(self) -> list[Carried]:
        """Every (source, target, transport) that carried a copy, sorted."""
        return [Carried(s, t, k, n, b) for (s, t, k), (n, b) in sorted(self._counts.items())]

    def _apply(self, changed: dict[_Key, tuple[int, int]]) -> None:
        if self.journal is not None:
            self.journal.transports_counted([Carried(*key, max(0, n), b if n > 0 else 0)
                                             for key, (n, b) in changed.items()])
        for key, (n, b) in changed.items():
            if n > 0:
                self._counts[key] = (n, b)
            else:
                self._counts.pop(key, None)
