"""Which scheduler orders a kvstore runs: fencing by the leader's epoch, and
each order id at most once (pure; no gRPC).

With scheduler replicas, one elected replica (the leader) issues orders, each
stamped with its epoch: etcd's create revision of the leader key, strictly
increasing from one leader to the next. A deposed leader may not know yet
that it is deposed and go on streaming; the kvstore is where that stops:

- `saw_epoch(e)` raises the newest epoch seen (from a heartbeat reply or an
  order); it never goes down.
- `admit(order_id, epoch)` is STALE for an epoch older than the newest seen
  (the order is dropped, unreported: its issuer no longer speaks for the
  cluster), DUPLICATE for an id already admitted (a new leader re-sends the
  ISSUED orders it adopted; one the old leader already sent here must not run
  twice), and RUN otherwise, which records the id.
- Epoch 0 is a single scheduler without election: unfenced while no epoch
  was ever seen; once one was, an epoch-0 order is stale like any older one.

Ids are remembered for the last `capacity` admitted orders (an LRU): a
re-send comes right after a failover, long before that many newer orders.
Thread-safe.
"""
from __future__ import annotations

import enum
import threading
from collections import OrderedDict


class Admission(enum.Enum):
    RUN = "run"
    STALE = "stale"  # an epoch older than the newest seen: a deposed leader's
    DUPLICATE = "duplicate"  # this id was admitted before


class OrderFence:
    def __init__(self, capacity: int = 16_384) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity}: must be at least 1")
        self._capacity = capacity
        self._newest_epoch = 0
        self._admitted: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.refused: dict[Admission, int] = {Admission.STALE: 0, Admission.DUPLICATE: 0}

    @property
    def newest_epoch(self) -> int:
        with self._lock:
            return self._newest_epoch

    def saw_epoch(self, epoch: int) -> None:
        with self._lock:
            self._newest_epoch = max(self._newest_epoch, epoch)

    def admit(self, order_id: str, epoch: int) -> Admission:
        with self._lock:
            if epoch < self._newest_epoch:
                verdict = Admission.STALE
            elif order_id in self._admitted:
                self._newest_epoch = epoch  # not stale: its sender leads now, whatever it re-sends
                self._admitted.move_to_end(order_id)
                verdict = Admission.DUPLICATE
            else:
                self._newest_epoch = epoch
                self._admitted[order_id] = None
                while len(self._admitted) > self._capacity:
                    self._admitted.popitem(last=False)
                return Admission.RUN
            self.refused[verdict] += 1
            return verdict
