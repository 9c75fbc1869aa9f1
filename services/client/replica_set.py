"""The scheduler replicas a RoutingClient asks, each with its own circuit
breaker: fixed channels the caller gave, or a target list the client dials
and keeps up to date itself.

- Channels given (one per replica): the set never changes; the channels
  stay the caller's.
- A target list (services/common/discovery.py: `HOST:PORT` and
  `dns:NAME:PORT` entries, comma-separated): each address is dialled with
  `dial` (default: a plaintext channel with SCHEDULER_CHANNEL_OPTIONS), and
  a TargetWatcher (discovery_watch.py) re-resolves the `dns:` names every
  `interval_s` (5 s): an address that joins gets a channel and a fresh
  breaker; one that every resolution for `grace_s` (15 s) has left out is
  dropped and its channel closed (a call in flight on it ends CANCELLED,
  which the client counts as a scheduler fault and asks the next replica).
  A failed resolution changes nothing. The first resolution happens in the
  constructor, so routes go to the replicas from the first call. These
  channels are the set's: close() closes them.
- `members()` is a tuple replaced whole under a lock by the watcher's
  thread; the Route path reads whichever tuple is current, without locking.
  It may be empty (a name that resolves to nothing yet): the client then
  falls back.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import grpc

from speckv.services.client.breaker import BreakerSettings, CircuitBreaker
from speckv.services.common.clock import Clock
from speckv.services.common.discovery import Changes, parse_targets
from speckv.services.common.discovery_watch import GRACE_S, INTERVAL_S, Resolve, TargetWatcher, resolve_dns
from speckv.services.common.errors import require
from speckv.v1 import scheduler_pb2_grpc

Dial = Callable[[str], grpc.Channel]

# Channel options for a scheduler channel: gRPC's default reconnect backoff grows to 120 s while a server is
# down, so a channel could still be waiting out its backoff long after the scheduler is back; capped at 1 s,
# the breaker's probe finds it within about open_s + 1 s.
SCHEDULER_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000))


def plaintext(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=list(SCHEDULER_CHANNEL_OPTIONS))


@dataclass(frozen=True, slots=True)
class Discovery:
    """How a target list's `dns:` names are followed (module docstring); resolve: name, port -> addresses."""

    interval_s: float = INTERVAL_S
    grace_s: float = GRACE_S
    resolve: Resolve = resolve_dns


@dataclass(slots=True)
class Replica:
    """One scheduler replica as the client sees it: its stub and its own breaker."""

    address: str  # "" for a channel the caller gave
    stub: scheduler_pb2_grpc.SchedulerStub
    breaker: CircuitBreaker
    channel: grpc.Channel | None = None  # the set's own channel (None: the caller's)


class ReplicaSet:
    def __init__(self, breaker: BreakerSettings, clock: Clock) -> None:
        self._breaker, self._clock = breaker, clock
        self._lock = threading.Lock()
        self._members: tuple[Replica, ...] = ()
        self._watcher: TargetWatcher | None = None
        self._dial: Dial = plaintext
        self._retired_opens = 0  # breaker opens of replicas dropped since (the count is cumulative)

    @classmethod
    def of_channels(cls, channels: Sequence[grpc.Channel], breaker: BreakerSettings, clock: Clock) -> "ReplicaSet":
        require(bool(channels), "at least one scheduler channel")
        made = cls(breaker, clock)
        made._members = tuple(Replica("", scheduler_pb2_grpc.SchedulerStub(c), CircuitBreaker(breaker, clock))
                              for c in channels)
        return made

    @classmethod
    def of_targets(cls, spec: str, breaker: BreakerSettings, clock: Clock, dial: Dial | None = None,
                   discovery: Discovery = Discovery()) -> "ReplicaSet":
        """InvalidArgument for a bad entry or an empty list."""
        targets = parse_targets(spec, "scheduler")
        require(not targets.empty, f"scheduler targets {spec!r}: none given")
        made = cls(breaker, clock)
        made._dial = dial or plaintext
        watcher = TargetWatcher(targets, made._changed, name="routing-client-discovery",
                                interval_s=discovery.interval_s, grace_s=discovery.grace_s,
                                resolve=discovery.resolve, clock=clock)
        made._changed(Changes(added=watcher.initial()))
        made._watcher = watcher
        if targets.names:
            watcher.refresh()  # the first resolution now, so the first route finds the replicas
            watcher.start()
        return made

    def members(self) -> tuple[Replica, ...]:
        return self._members

    def addresses(self) -> tuple[str, ...]:
        return tuple(r.address for r in self._members)

    def breaker_opens(self) -> int:
        """Every replica's breaker opens since the start, the dropped replicas' included."""
        return self._retired_opens + sum(r.breaker.opens for r in self._members)

    def close(self) -> None:
        """Stops following the names and closes the set's own channels (not the caller's)."""
        if self._watcher is not None:
            self._watcher.stop()
        with self._lock:
            gone = [r.channel for r in self._members if r.channel is not None]
            self._members = tuple(r for r in self._members if r.channel is None)
        for channel in gone:
            channel.close()

    def _changed(self, changes: Changes) -> None:
        """The watcher's callback (and the constructor's for the static entries)."""
        added = []
        for address in changes.added:
            channel = self._dial(address)
            added.append(Replica(address, scheduler_pb2_grpc.SchedulerStub(channel),
                                 CircuitBreaker(self._breaker, self._clock), channel))
        with self._lock:
            kept = tuple(r for r in self._members if r.address not in changes.removed)
            gone = [r for r in self._members if r.address in changes.removed]
            self._members = kept + tuple(added)
            self._retired_opens += sum(r.breaker.opens for r in gone)
        for replica in gone:
            if replica.channel is not None:
                replica.channel.close()
