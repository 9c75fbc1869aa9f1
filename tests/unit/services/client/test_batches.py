"""The bounded report queue (services/client/batches.py): batches, drops, failures, close."""
from __future__ import annotations

import threading

from speckv.services.client.batches import BatchQueue, BatchSettings
from tests.support.waiting import wait_until


def test_items_go_in_batches_of_at_most_batch_max():
    sent: list[list[int]] = []
    q: BatchQueue[int] = BatchQueue("t", sent.append, BatchSettings(batch_max=3, flush_s=0.05))
    for i in range(7):
        assert q.offer(i)
    q.close()
    assert [i for b in sent for i in b] == list(range(7)) and max(len(b) for b in sent) <= 3
    s = q.stats()
    assert (s.offered, s.sent, s.failed, s.dropped, s.batches) == (7, 7, 0, 0, len(sent))


def test_a_full_queue_drops_and_counts_without_blocking():
    gate = threading.Event()
    taken: list[list[int]] = []

    def send(batch: list[int]) -> None:
        taken.append(batch)
        gate.wait(10)

    q: BatchQueue[int] = BatchQueue("t", send, BatchSettings(batch_max=1, flush_s=0.01, capacity=2))
    assert q.offer(0)
    assert wait_until(lambda: taken)  # the thread holds item 0 in send
    assert q.offer(1) and q.offer(2)
    assert not q.offer(3)  # full: dropped at once
    assert q.stats().dropped == 1
    gate.set()
    q.close()
    assert q.stats().sent == 3


def test_a_failing_sender_fails_its_batch_and_the_thread_lives_on():
    calls: list[int] = []

    def send(batch: list[int]) -> None:
        calls.append(len(batch))
        if len(calls) == 1:
            raise RuntimeError("down")

    q: BatchQueue[int] = BatchQueue("t", send, BatchSettings(batch_max=1, flush_s=0.01))
    q.offer(1)
    assert wait_until(lambda: q.stats().failed == 1)
    q.offer(2)
    q.close()
    assert (q.stats().failed, q.stats().sent) == (1, 1)


def test_an_offer_after_close_is_dropped():
    q: BatchQueue[int] = BatchQueue("t", lambda b: None)
    q.close()
    assert not q.offer(1) and q.stats().dropped == 1


def test_a_rejected_item_counts_as_offered_and_dropped():
    q: BatchQueue[int] = BatchQueue("t", lambda b: None)
    assert not q.reject()
    q.close()
    s = q.stats()
    assert (s.offered, s.dropped, s.sent) == (1, 1, 0)
