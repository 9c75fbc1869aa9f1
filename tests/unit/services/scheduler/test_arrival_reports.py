import threading

from speckv.services.scheduler.arrival_reports import ArrivalRecord, ArrivalReporter


class Collecting:
    def __init__(self, fail=False):
        self.batches = []
        self.fail = fail
        self.got = threading.Event()

    def send(self, batch):
        self.got.set()
        if self.fail:
            raise ConnectionError("predictor down")
        self.batches.append(list(batch))


class Blocking:
    def __init__(self):
        self.release = threading.Event()
        self.entered = threading.Event()

    def send(self, batch):
        self.entered.set()
        self.release.wait(10)


def rec(i):
    return ArrivalRecord(float(i), "f", "a", 100, 0)


def wait_until(predicate, timeout=10.0):
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return True
        done.wait(0.01)
    return predicate()


def test_batches_reach_the_sender():
    sender = Collecting()
    r = ArrivalReporter(sender, batch_max=4, flush_s=0.05).start()
    for i in range(10):
        assert r.offer(rec(i))
    assert wait_until(lambda: r.stats().sent == 10)
    r.stop()
    sent = [a.time_s for b in sender.batches for a in b]
    assert sent == [float(i) for i in range(10)] and all(len(b) <= 4 for b in sender.batches)


def test_full_queue_drops_without_blocking():
    sender = Blocking()
    r = ArrivalReporter(sender, capacity=3, batch_max=1, flush_s=0.05).start()
    r.offer(rec(0))
    assert sender.entered.wait(10)  # the thread is stuck in send with one arrival
    results = [r.offer(rec(i)) for i in range(1, 10)]
    assert results.count(True) == 3 and r.stats().dropped_full == 6
    sender.release.set()
    r.stop()


def test_failed_sends_are_counted_and_thread_survives():
    sender = Collecting(fail=True)
    r = ArrivalReporter(sender, flush_s=0.05, backoff_s=0.01, backoff_max_s=0.02).start()
    r.offer(rec(1))
    assert wait_until(lambda: r.stats().dropped_send == 1)
    sender.fail = False
    r.offer(rec(2))
    assert wait_until(lambda: r.stats().sent == 1)
    r.stop()
