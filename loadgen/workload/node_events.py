"""Named node events (services/config/events.json, or a user's own file of
the same shape): node loss and node addition at a trace time.

An event set is a list of events; each is a kind (kill, add), a time (`at`:
"peak" or trace seconds, plus `after_s`) and, for a kill, which node
("most-kv" or a node id). `resolve` turns a set into ScheduledEvents with
absolute trace times for one replayed slice; which node "most-kv" names is
decided when the event happens (it depends on the run), a node id is
checked then against the nodes that exist. A bad file, an unknown set, a
time outside the slice: InvalidArgument (NotFound for an unknown set name),
before any simulation starts.
"""
from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from speckv.services.common.config import CONFIG_DIR
from speckv.services.common.errors import InvalidArgument, NotFound

DEFAULT_EVENTS_PATH = CONFIG_DIR / "events.json"
PEAK_WINDOW_S = 60.0
MOST_KV = "most-kv"


class EventKind(enum.Enum):
    KILL = "kill"
    ADD = "add"


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One event as the file states it."""

    kind: EventKind
    at: str | float  # "peak" or trace seconds
    after_s: float = 0.0
    node: str = ""  # a kill's victim: MOST_KV or a node id; "" for an add


@dataclass(frozen=True, slots=True)
class ScheduledEvent:
    """One event at an absolute trace time (seconds)."""

    kind: EventKind
    at_s: float
    node: str = ""


def load_event_sets(path: Path | str | None = None) -> dict[str, list[EventSpec]]:
    """Every set of the file, parsed and checked."""
    source = Path(path) if path else DEFAULT_EVENTS_PATH
    try:
        table = json.loads(source.read_text())["events"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument(f"events file {source}: cannot read its 'events' table ({exc})") from None
    if not isinstance(table, dict):
        raise InvalidArgument(f"events file {source}: 'events' must be an object of named sets")
    return {name: [_parse(name, i, e) for i, e in enumerate(_entries(name, body))] for name, body in table.items()}


def get_event_set(name: str, path: Path | str | None = None) -> list[EventSpec]:
    sets = load_event_sets(path)
    if name not in sets:
        raise NotFound(f"no event set {name!r}; known: {', '.join(sorted(sets))}")
    return sets[name]


def _entries(name: str, body: object) -> list[object]:
    events = body.get("events") if isinstance(body, dict) else None
    if not isinstance(events, list) or not events:
        raise InvalidArgument(f"event set {name!r}: needs a non-empty 'events' list")
    return events


def _parse(name: str, i: int, raw: object) -> EventSpec:
    where = f"event set {name!r}, event {i}"
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{where}: expected an object")
    unknown = set(raw) - {"kind", "at", "after_s", "node"}
    if unknown:
        raise InvalidArgument(f"{where}: unknown key(s) {sorted(unknown)}")
    try:
        kind = EventKind(raw.get("kind"))
    except ValueError:
        raise InvalidArgument(f"{where}: kind must be one of {[k.value for k in EventKind]}") from None
    at = raw.get("at", "peak")
    if not (at == "peak" or (isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at))):
        raise InvalidArgument(f"{where}: at must be \"peak\" or a trace time in seconds, not {at!r}")
    after_s = raw.get("after_s", 0.0)
    if not isinstance(after_s, (int, float)) or isinstance(after_s, bool) or not 0 <= after_s < math.inf:
        raise InvalidArgument(f"{where}: after_s must be a number >= 0")
    node = raw.get("node", MOST_KV if kind is EventKind.KILL else "")
    if kind is EventKind.ADD and node:
        raise InvalidArgument(f"{where}: an add names no node (the new node gets the next free id)")
    if kind is EventKind.KILL and (not isinstance(node, str) or not node):
        raise InvalidArgument(f"{where}: a kill's node must be {MOST_KV!r} or a node id")
    return EventSpec(kind, at if at == "peak" else float(at), float(after_s), node)


def peak_start_s(arrivals_s: Sequence[float] | np.ndarray, window_s: float = PEAK_WINDOW_S) -> float:
    """The start of the busiest window: among windows [t, t + window_s) with t
    on a whole second inside the arrivals' span, the one with the most
    arrivals (ties: the earliest)."""
    times = np.sort(np.asarray(arrivals_s, dtype=float))
    if times.size == 0:
        raise InvalidArgument("no arrivals to find a peak in")
    starts = np.arange(math.floor(times[0]), math.floor(times[-1]) + 1, dtype=float)
    counts = np.searchsorted(times, starts + window_s, side="left") - np.searchsorted(times, starts, side="left")
    return float(starts[int(np.argmax(counts))])


def resolve(specs: Sequence[EventSpec], arrivals_s: Sequence[float] | np.ndarray,
            name: str = "") -> list[ScheduledEvent]:
    """The set's events at absolute times for a slice with these arrivals
    (trace s), in time order; each must fall inside the slice."""
    times = np.asarray(arrivals_s, dtype=float)
    if times.size == 0:
        raise InvalidArgument(f"event set {name!r}: the slice has no requests")
    lo, hi = float(times.min()), float(times.max())
    peak = peak_start_s(times) if any(s.at == "peak" for s in specs) else lo
    out = []
    for i, spec in enumerate(specs):
        at_s = (peak if spec.at == "peak" else float(spec.at)) + spec.after_s
        if not lo <= at_s <= hi:
            raise InvalidArgument(f"event set {name!r}, event {i}: at {at_s:.1f} s is outside the replayed slice "
                                  f"[{lo:.1f}, {hi:.1f}] s")
        out.append(ScheduledEvent(spec.kind, at_s, spec.node))
    return sorted(out, key=lambda e: e.at_s)


def describe(specs: Sequence[EventSpec]) -> list[Mapping[str, object]]:
    return [{"kind": s.kind.value, "at": s.at, "after_s": s.after_s, **({"node": s.node} if s.node else {})}
            for s in specs]
