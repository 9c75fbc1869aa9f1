"""Loads that run beside the engine's steps (the connector's `load_async`):
vLLM parks a request whose connector answered load_async=True in
WAITING_FOR_REMOTE_KVS, with its pages allocated, until the worker reports
it in finished_recving; it then schedules the request with the loaded
tokens as computed. A request in failed_recving (also in finished_recving)
is recomputed from its start.

Two threads: one runs the node's own loads in the order they were started,
the other the pulls from peers (a pull waits for a peer's copy, up to the
transfer timeout), so a slow peer holds later pulls, never a local load
nor the engine's steps. A request's local load and its pull write disjoint
pages.

Invariants: a request is reported exactly once, after every one of its
loads has ended (failed when any failed); its pages are written only
before it is reported (vLLM does not free or reuse them while it waits,
and the scheduler side delays their freeing if the request ends first).
"""
from __future__ import annotations

import logging
import threading
from concurrent import futures
from typing import Callable, Sequence

from speckv.services.engine.vllm_connector.plan import LoadSpec

log = logging.getLogger("speckv.vllm_connector")


class BackgroundLoads:
    def __init__(self, load_one: Callable[[LoadSpec], bool]) -> None:
        """load_one: runs one load into the engine's pages; whether it succeeded (it never raises)."""
        self._load_one = load_one
        self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="speckv-load")
        self._pulls = futures.ThreadPoolExecutor(1, thread_name_prefix="speckv-pull")
        self._lock = threading.Lock()
        self._remaining: dict[str, int] = {}  # req_id -> its loads not yet ended
        self._failed_any: set[str] = set()
        self._finished: set[str] = set()
        self._failed: set[str] = set()

    def start(self, specs: Sequence[LoadSpec]) -> None:
        with self._lock:
            for spec in specs:
                self._remaining[spec.req_id] = self._remaining.get(spec.req_id, 0) + 1
        for spec in specs:
            (self._pulls if spec.source else self._pool).submit(self._run, spec)

    def _run(self, spec: LoadSpec) -> None:
        try:
            ok = self._load_one(spec)
        except Exception:  # noqa: BLE001 - a load fails open: the request is recomputed, never lost
            log.exception("speckv: a background load of request %s failed", spec.req_id)
            ok = False
        with self._lock:
            if not ok:
                self._failed_any.add(spec.req_id)
            self._remaining[spec.req_id] -= 1
            if self._remaining[spec.req_id] == 0:
                del self._remaining[spec.req_id]
                self._finished.add(spec.req_id)
                if spec.req_id in self._failed_any:
                    self._failed_any.discard(spec.req_id)
                    self._failed.add(spec.req_id)

    def take_finished(self) -> tuple[set[str], set[str]]:
        """The requests whose loads all ended since the last call, and of
        those the ones where any failed."""
        with self._lock:
            finished, failed = self._finished, self._failed
            self._finished, self._failed = set(), set()
            return finished, failed

    def in_flight(self) -> int:
        with self._lock:
            return len(self._remaining)

    def shutdown(self) -> None:
        """Ends the threads after the loads running now (queued ones are dropped: the engine is stopping)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pulls.shutdown(wait=True, cancel_futures=True)
