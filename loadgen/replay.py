"""Open-loop trace replay against a running cluster.

Arrival times are honoured (scaled by `speed`), never waiting for responses:
each request is handed to a worker pool at its time. The stand-in engine here
only routes and stores the prompt's new full blocks on the chosen node, so the
block index grows the way a real cluster's does; the emulated engine with
continuous batching and measured TTFT comes with the end-to-end issue.
"""
from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import grpc
import numpy as np

from speckv.loadgen.traces import TraceRequest
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc


@dataclass(slots=True)
class RequestOutcome:
    """What happened to one replayed request. Times in seconds/milliseconds."""

    index: int
    node_id: str
    prompt_tokens: int
    cached_tokens: int
    expected_ttft_ms: float
    blocks_stored: int
    route_latency_ms: float
    error: str = ""


def block_payload(block_hash: int, nbytes: int) -> bytes:
    """Deterministic bytes for a block, so a replica can be checked byte-exact."""
    words = np.full(nbytes // 8, block_hash * 0x9E3779B97F4A7C15 % (1 << 64), dtype=np.uint64)
    return words.tobytes() + bytes(nbytes % 8)


class Replayer:
    def __init__(self, scheduler: str, nodes: dict[str, str], bytes_per_block: int, workers: int = 16) -> None:
        self._scheduler_channel = grpc.insecure_channel(scheduler)
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(self._scheduler_channel)
        self._node_channels = {n: grpc.insecure_channel(a, options=[("grpc.max_send_message_length", 1 << 30)])
                               for n, a in nodes.items()}
        self._nodes = {n: kvstore_pb2_grpc.KVStoreStub(c) for n, c in self._node_channels.items()}
        self._bytes_per_block = bytes_per_block
        self._pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="replay")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for channel in (self._scheduler_channel, *self._node_channels.values()):
            channel.close()

    def replay(self, requests: Sequence[TraceRequest], speed: float,
               on_done: Callable[[RequestOutcome], None] = lambda _: None) -> list[RequestOutcome]:
        """Sends each request at (arrival - first arrival) / speed seconds."""
        if not requests:
            return []
        origin, start = requests[0].arrival_s, time.monotonic()
        pending = []
        for index, request in enumerate(requests):
            delay = (request.arrival_s - origin) / speed - (time.monotonic() - start)
            if delay > 0:
                time.sleep(delay)
            future = self._pool.submit(self._serve, index, request)
            future.add_done_callback(lambda f: on_done(f.result()))
            pending.append(future)
        return [f.result() for f in pending]

    def _serve(self, index: int, request: TraceRequest) -> RequestOutcome:
        hashes = list(request.block_hashes[:request.full_blocks])
        started = time.perf_counter()
        try:
            route = self._scheduler.Route(scheduler_pb2.RouteRequest(
                request_id=f"r{index}", block_hashes=hashes, prompt_tokens=request.prompt_tokens,
                family=request.family), timeout=5.0)
        except grpc.RpcError as exc:
            return RequestOutcome(index, "", request.prompt_tokens, 0, 0.0, 0, 0.0, f"route: {exc.code().name}")
        route_ms = (time.perf_counter() - started) * 1e3
        cached = min(route.cached_blocks, len(hashes))
        stored, error = self._store(route.node_id, hashes, cached)
        return RequestOutcome(index, route.node_id, request.prompt_tokens, cached * request.block_tokens,
                              route.expected_ttft_ms, stored, route_ms, error)

    def _store(self, node_id: str, hashes: list[int], cached: int) -> tuple[int, str]:
        """After prefill the engine stores the prompt's new full blocks."""
        new = hashes[cached:]
        if not new:
            return 0, ""

        def blocks() -> Iterator[kvstore_pb2.PutBlockRequest]:
            for position in range(cached, len(hashes)):
                parent = hashes[position - 1] if position else 0
                yield kvstore_pb2.PutBlockRequest(block_hash=hashes[position],
                                                  data=block_payload(hashes[position], self._bytes_per_block),
                                                  family=str(hashes[0]), parent_hash=parent,
                                                  has_parent=position > 0)

        try:
            reply = self._nodes[node_id].PutBlocks(blocks(), timeout=30.0)
        except grpc.RpcError as exc:
            return 0, f"put: {exc.code().name}: {exc.details()}"
        return reply.stored, ""
