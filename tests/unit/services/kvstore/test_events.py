from __future__ import annotations

import queue
import threading

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.kvstore.events import EventLog, EventType

TIMEOUT = 10.0


class Resident:
    """A stand-in inventory kept in step with the log, read atomically."""

    def __init__(self, log):
        self.log = log
        self.hashes = []

    def store(self, *hashes):
        self.hashes += hashes
        self.log.append(EventType.STORED, tuple(hashes))

    def snapshot(self):
        return list(self.hashes), self.log.last_sequence, []


def make(retention=100):
    log = EventLog("n1", 4, retention, ManualClock(100.0))
    return log, Resident(log)


def collect(log, resident, after, keep_going=lambda: True):
    """Runs a subscriber on a thread; returns its queue and thread."""
    out = queue.Queue()

    def run():
        for event in log.subscribe(after, resident.snapshot, keep_going, poll_s=0.05):
            out.put(event)
        out.put(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return out, thread


def take(out, n):
    return [out.get(timeout=TIMEOUT) for _ in range(n)]


def test_sequences_increase_by_one_and_retention_is_bounded():
    log, resident = make(retention=3)
    for h in range(5):
        resident.store(h)
    assert log.last_sequence == 5
    assert [e.sequence for e in log._events] == [3, 4, 5]
    event = log._events[-1]
    assert event.node_id == "n1" and event.block_size == 4 and event.time_s == 100.0


def test_fresh_subscriber_on_empty_store_gets_deltas_only():
    log, resident = make()
    out, thread = collect(log, resident, 0)
    resident.store(1, 2)
    resident.store(3)
    events = take(out, 2)
    assert [(e.type, e.block_hashes, e.sequence) for e in events] == [
        (EventType.STORED, (1, 2), 1), (EventType.STORED, (3,), 2)]
    log.close()
    assert out.get(timeout=TIMEOUT) is None
    thread.join(TIMEOUT)


def test_subscriber_from_zero_on_non_empty_store_starts_with_snapshot():
    log, resident = make()
    resident.store(1, 2)
    log.append(EventType.REMOVED, (1,))
    resident.hashes.remove(1)
    out, _ = collect(log, resident, 0)
    snapshot = take(out, 1)[0]
    assert snapshot.type is EventType.SNAPSHOT and snapshot.block_hashes == (2,) and snapshot.sequence == 2
    resident.store(7)
    assert take(out, 1)[0].sequence == 3
    log.close()


def test_resume_inside_retention_gets_only_the_missing_deltas():
    log, resident = make()
    for h in range(4):
        resident.store(h)
    out, _ = collect(log, resident, 2)
    assert [e.sequence for e in take(out, 2)] == [3, 4]
    log.close()
    assert out.get(timeout=TIMEOUT) is None


@pytest.mark.parametrize("after", [1, 99])  # older than retained, or from the future
def test_resume_outside_retention_gets_snapshot_then_deltas(after):
    log, resident = make(retention=2)
    for h in range(5):
        resident.store(h)
    out, _ = collect(log, resident, after)
    snapshot = take(out, 1)[0]
    assert snapshot.type is EventType.SNAPSHOT
    assert snapshot.block_hashes == (0, 1, 2, 3, 4) and snapshot.sequence == 5
    resident.store(9)
    assert take(out, 1)[0].block_hashes == (9,)
    log.close()


def test_subscription_ends_when_keep_going_turns_false():
    log, resident = make()
    going = threading.Event()
    going.set()
    out, thread = collect(log, resident, 0, keep_going=going.is_set)
    resident.store(1)
    take(out, 1)
    going.clear()
    assert out.get(timeout=TIMEOUT) is None
    thread.join(TIMEOUT)
    assert not thread.is_alive()
