"""The disk writer: batches what is queued, refuses what its bounded queue
cannot take (never blocks the caller), writes the rest before it stops."""
from __future__ import annotations

import threading

from speckv.services.kvstore.disk.writer import BackgroundWriter, InlineWriter


def test_a_full_queue_refuses_without_blocking_and_batches_drain_it():
    gate, batches = threading.Event(), []

    def sink(batch):
        gate.wait(timeout=30)
        batches.append(list(batch))

    writer = BackgroundWriter(sink, capacity=3, batch=8)
    writer.start()
    try:
        assert writer.offer(0)
        while writer._queue.qsize():  # the thread took item 0 and waits in the sink
            threading.Event().wait(0.01)
        offered = [writer.offer(i) for i in range(1, 6)]
        assert offered == [True, True, True, False, False]  # 3 queued: the rest refused at once
        gate.set()
        writer.flush()
        assert batches == [[0], [1, 2, 3]]
    finally:
        gate.set()
        writer.stop()
    assert not writer.offer(9)


def test_stop_writes_what_is_queued_and_a_failing_batch_keeps_the_thread():
    seen = []

    def sink(batch):
        if batch[0] == "boom":
            raise RuntimeError("a bad batch")
        seen.extend(batch)

    writer = BackgroundWriter(sink, capacity=8, batch=1)
    writer.start()
    writer.offer("boom")
    writer.offer("a")
    writer.offer("b")
    writer.stop()
    assert seen == ["a", "b"]


def test_the_inline_writer_runs_the_sink_in_offer():
    seen = []
    writer = InlineWriter(seen.extend)
    assert writer.offer(1) and seen == [1]
