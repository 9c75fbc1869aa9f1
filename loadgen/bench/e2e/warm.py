"""Warm start of one policy's fresh cluster: the state the trace before the
slice would have left, so the slice does not begin on an empty cluster that
no real one ever is.

Every request of the `warmup_s` before the slice is routed through the
scheduler (in arrival order, `arrival_time_s` its time mapped onto the
services' clock): the scheduler learns its family and reports the arrival to
the predictor, exactly as during the replay. No engine runs, so the only load
the router sees is the work routed so far (the scheduler's pending figures,
which the kvstores' free-pages-only heartbeats no longer wipe); placement is
KV-aware and spread by routed tokens.

KV: the requests' new full blocks are stored (PutBlocks) on the node they were
routed to, for the newest requests only, as many as fit in `resident_fraction`
of the cluster's pages: older KV would have been evicted by now anyway, and
writing it would only cost start-up time. Blocks are the router's
deterministic payloads (router.block_payload), so replicas stay checkable,
unless the caller passes `store_kv`: a real engine then computes and stores
the request's real KV on that node itself.

Invariant: nothing from the slice itself is routed, stored or observed here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import grpc

from speckv.loadgen.experiments.reference_router import block_payload
from speckv.loadgen.experiments.warm_start import resident_tail
from speckv.loadgen.workload.replay import TimeMap
from speckv.services.common.traces import TraceRequest
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

RPC_TIMEOUT_S = 30.0
ROUTE_BATCH = 128


@dataclass(frozen=True, slots=True)
class WarmStats:
    routed: int  # pre-slice requests routed (and reported to the predictor)
    stored_requests: int  # of those, the newest whose KV was stored
    stored_blocks: int
    seconds: float  # wall time the warm start took


def warm_cluster(scheduler: grpc.Channel, kvstores: Mapping[str, grpc.Channel], warm: Sequence[TraceRequest],
                 unix_times: TimeMap, stored_bytes_per_block: int, max_blocks: int,
                 store_kv: Callable[[str, int, TraceRequest, int], int] | None = None) -> WarmStats:
    """store_kv(node, index, request, first uncached block) -> blocks stored.

    Requests whose KV is not stored are routed ROUTE_BATCH at a time (one
    RouteBatch call routes them in order, each seeing the load of those
    before it); the stored newest ones one by one, so each sees the blocks
    stored before it."""
    began = time.monotonic()
    stub = scheduler_pb2_grpc.SchedulerStub(scheduler)
    stores = {n: kvstore_pb2_grpc.KVStoreStub(c) for n, c in kvstores.items()}
    first_stored = resident_tail(warm, max_blocks)
    for lo in range(0, first_stored, ROUTE_BATCH):
        batch = [_route_request(i, warm[i], unix_times) for i in range(lo, min(first_stored, lo + ROUTE_BATCH))]
        stub.RouteBatch(scheduler_pb2.RouteBatchRequest(requests=batch), timeout=RPC_TIMEOUT_S)
    blocks = 0
    for i in range(first_stored, len(warm)):
        r = warm[i]
        hashes = list(r.block_hashes[:r.full_blocks])
        route = stub.Route(_route_request(i, r, unix_times), timeout=RPC_TIMEOUT_S)
        if route.cached_blocks >= len(hashes):
            continue
        if store_kv is not None:
            blocks += store_kv(route.node_id, i, r, route.cached_blocks)
            continue
        reply = stores[route.node_id].PutBlocks(
            _puts(hashes, route.cached_blocks, r.family, stored_bytes_per_block), timeout=RPC_TIMEOUT_S)
        blocks += reply.stored
    return WarmStats(len(warm), len(warm) - first_stored, blocks, time.monotonic() - began)


def _route_request(i: int, r: TraceRequest, unix_times: TimeMap) -> scheduler_pb2.RouteRequest:
    return scheduler_pb2.RouteRequest(request_id=f"warm-{i}", block_hashes=list(r.block_hashes[:r.full_blocks]),
                                      prompt_tokens=r.prompt_tokens, family=r.family,
                                      arrival_time_s=unix_times.to_clock(r.arrival_s))


def _puts(hashes: list[int], first: int, family: str, nbytes: int) -> Iterator[kvstore_pb2.PutBlockRequest]:
    for i in range(first, len(hashes)):
        yield kvstore_pb2.PutBlockRequest(block_hash=hashes[i], data=block_payload(hashes[i], nbytes), family=family,
                                          parent_hash=hashes[i - 1] if i else 0, has_parent=i > 0)
