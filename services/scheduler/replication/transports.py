"""Which data plane carried the committed copies between each pair of nodes
(issue 42: `speckv status` says which transport carried each transfer).

The source's agent reports the transport its kvstore used with the order's
COMMITTED (OrderStatusReport.transport: shm, nixl, tcp or grpc). The tally
counts committed copy orders and their bytes per (source, target,
transport), cumulative since the scheduler started; a copy committed without
a report counts under "" until its source's late COMMITTED names the
transport (the scheduler may see the blocks in the target's KV events
first; that report is then an idempotent repeat that only labels). Pure: no
clock, no I/O. Not thread-safe: SchedulerCore serialises access.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

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


class TransportTally:
    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, str], list[int]] = {}

    def add(self, source: str, target: str, transport: str, nbytes: int) -> None:
        """One committed copy of nbytes bytes."""
        counts = self._counts.setdefault((source, target, transport), [0, 0])
        counts[0] += 1
        counts[1] += max(0, nbytes)

    def relabel(self, source: str, target: str, transport: str, nbytes: int) -> None:
        """A copy counted under "" (committed from the target's KV events
        before its source's report) moves to the transport reported late."""
        unlabelled = self._counts.get((source, target, ""))
        if unlabelled is None:
            return
        unlabelled[0] -= 1
        unlabelled[1] -= max(0, nbytes)
        if unlabelled[0] <= 0:
            del self._counts[(source, target, "")]
        self.add(source, target, transport, nbytes)

    def rows(self) -> list[Carried]:
        """Every (source, target, transport) that carried a copy, sorted."""
        return [Carried(s, t, k, n, b) for (s, t, k), (n, b) in sorted(self._counts.items())]
