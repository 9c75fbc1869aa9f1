"""Who may wait to authenticate on the TCP data plane: the table of
unauthenticated connections (accepted, their opening frame not yet read and
verified). Pure: no sockets, no clock of its own (callers pass `now`,
seconds on a monotonic clock).

A data connection holds no slot of `data_max_connections` until its opening
frame verifies (listener.py); until then it is one row here, bounded three
ways so idle or slow sockets cannot starve the rightful senders:

- `capacity` rows in all (`data_unauth_max_connections`);
- `per_address` rows per source address (`data_unauth_per_address`): one
  host over it is refused at once, so a single flooding host holds at most
  that many rows;
- `deadline_s` per row (`data_auth_timeout_s`): a row older than that is
  expired (its connection closed), so a row is held for at most deadline_s
  however fast the host reconnects.

Admission when the table is full (the flood comes from many addresses):
the newcomer displaces the oldest row among the addresses holding the most
rows, unless the newcomer's own address already holds at least as many
(then the newcomer is refused). So a new address always gets in while any
other address holds two or more rows, and its one row is never displaced
while any address holds two: a flood displaces itself first. Only a flood
from at least `capacity` distinct addresses (one row each) can displace a
rightful sender's row, and then only once `capacity` newer connections
arrived within its opening's round trip (its opening frame follows its
connect at once).

Invariants: rows <= capacity; rows of one address <= per_address; every
row admitted is removed exactly once (settle, expire or displacement);
expiry order is admission order (rows' deadlines never decrease when `now`
does not). Not thread-safe: one thread (the listener's gate loop) owns it.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum
from typing import NewType

ConnId = NewType("ConnId", int)


class Refusal(Enum):
    """Why a connection was refused a row."""

    PER_ADDRESS = "per_address"  # its address already holds per_address rows
    FULL = "full"  # the table is full and its address holds the most rows


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to one admit: admitted (perhaps displacing `displaced`,
    whose connection the caller closes) or refused for `refusal`."""

    admitted: bool
    refusal: Refusal | None = None
    displaced: ConnId | None = None


@dataclass(slots=True)
class UnauthCounts:
    """Connections ended while unauthenticated, by cause, since start."""

    refused_per_address: int = 0
    refused_full: int = 0
    displaced: int = 0
    timed_out: int = 0


class UnauthTable:
    """The rows of unauthenticated connections; see the module doc.
    capacity, per_address: rows (>= 1); deadline_s: seconds (> 0)."""

    def __init__(self, capacity: int, per_address: int, deadline_s: float) -> None:
        if capacity < 1 or per_address < 1 or not deadline_s > 0:
            raise ValueError(f"unauthenticated connections: capacity={capacity}, per_address={per_address} "
                             f"must be >= 1 and deadline_s={deadline_s} > 0")
        self.capacity = capacity
        self.per_address = per_address
        self.deadline_s = deadline_s
        self.counts = UnauthCounts()
        self._rows: OrderedDict[ConnId, tuple[str, float]] = OrderedDict()  # admission order: id -> (address, deadline)
        self._by_address: dict[str, OrderedDict[ConnId, None]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, conn: object) -> bool:
        return conn in self._rows

    def held_by(self, address: str) -> int:
        rows = self._by_address.get(address)
        return len(rows) if rows else 0

    def admit(self, conn: ConnId, address: str, now: float) -> Admission:
        """A row for conn, from address, until now + deadline_s, or the refusal."""
        if conn in self._rows:
            raise ValueError(f"connection {conn} already holds a row")
        own = self.held_by(address)
        if own >= self.per_address:
            self.counts.refused_per_address += 1
            return Admission(False, Refusal.PER_ADDRESS)
        displaced: ConnId | None = None
        if len(self._rows) >= self.capacity:
            most = max(len(rows) for rows in self._by_address.values())
            if own >= most:
                self.counts.refused_full += 1
                return Admission(False, Refusal.FULL)
            # The oldest row of an address holding `most`: ties go to the address that waited longest.
            displaced = next(c for c, (a, _) in self._rows.items() if len(self._by_address[a]) == most)
            self._remove(displaced)
            self.counts.displaced += 1
        self._rows[conn] = (address, now + self.deadline_s)
        self._by_address.setdefault(address, OrderedDict())[conn] = None
        return Admission(True, None, displaced)

    def settle(self, conn: ConnId) -> bool:
        """conn leaves the table (authenticated, refused, or gone); False if
        it held no row (already expired or displaced)."""
        if conn not in self._rows:
            return False
        self._remove(conn)
        return True

    def expire(self, now: float) -> list[ConnId]:
        """Removes and returns the rows whose deadline is at or before now,
        oldest first; each counts as timed out."""
        gone: list[ConnId] = []
        while self._rows:
            conn, (_address, deadline) = next(iter(self._rows.items()))
            if deadline > now:
                break
            self._remove(conn)
            gone.append(conn)
        self.counts.timed_out += len(gone)
        return gone

    def next_deadline(self) -> float | None:
        """The earliest deadline of a row (seconds), None when empty."""
        if not self._rows:
            return None
        return next(iter(self._rows.values()))[1]

    def _remove(self, conn: ConnId) -> None:
        address, _ = self._rows.pop(conn)
        rows = self._by_address[address]
        del rows[conn]
        if not rows:
            del self._by_address[address]
