"""Follows every kvstore's KV event stream into one ReplicaLedger (gRPC; not
core). One thread per node; stop() cancels the streams. The ledger is read
and written under one lock, shared with the router's replica reads."""
from __future__ import annotations

import logging
import threading
from typing import Mapping

import grpc

from speckv.loadgen.experiments.replica_ledger import KVEventKind, ReplicaLedger
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc

log = logging.getLogger(__name__)
_KINDS = {kvstore_pb2.KV_EVENT_TYPE_STORED: KVEventKind.STORED,
          kvstore_pb2.KV_EVENT_TYPE_REMOVED: KVEventKind.REMOVED,
          kvstore_pb2.KV_EVENT_TYPE_COMMITTED: KVEventKind.COMMITTED,
          kvstore_pb2.KV_EVENT_TYPE_SNAPSHOT: KVEventKind.SNAPSHOT}


class EventCollector:
    """`time_of` maps an event (node clock seconds) to the caller's time axis."""

    def __init__(self, channels: Mapping[str, grpc.Channel], ledger: ReplicaLedger, lock: threading.Lock,
                 time_of=lambda node_time_s: node_time_s) -> None:
        self._stubs = {n: kvstore_pb2_grpc.KVStoreStub(c) for n, c in channels.items()}
        self._ledger, self._lock, self._time_of = ledger, lock, time_of
        self._calls: list[grpc.Future] = []
        self._calls_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._follow, args=(n,), name=f"events-{n}", daemon=True)
                         for n in self._stubs]
        self.events = 0

    def start(self) -> "EventCollector":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._calls_lock:
            for call in self._calls:
                call.cancel()
        for thread in self._threads:
            thread.join(timeout=5.0)

    def _follow(self, node: str) -> None:
        call = self._stubs[node].SubscribeEvents(kvstore_pb2.SubscribeEventsRequest(after_sequence=0))
        with self._calls_lock:
            self._calls.append(call)
        try:
            for event in call:
                kind = _KINDS.get(event.type)
                if kind is None:
                    continue
                with self._lock:
                    self._ledger.apply(node, kind, event.block_hashes, self._time_of(event.time_s),
                                       event.order_id, event.family)
                    self.events += 1
        except grpc.RpcError as exc:
            if not self._stop.is_set():
                log.warning("KV event stream of %s broke: %s", node, exc.code().name)
