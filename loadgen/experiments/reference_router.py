"""Reference inference router: the scheduler's user.

For each request, on a worker pool (so the replayer never waits): Route
(which also reports the arrival to the predictor), note which cached blocks on
the chosen node are speculative replicas, dispatch to that node's engine with
its cached and fetched tokens. When the engine's prefill is done the node
stores the prompt's new full blocks in its kvstore (pulled blocks are read
from the holder with GetBlocks, new ones are generated), so the block index
grows the way a real cluster's does; when it finishes, the record is complete.

Jobs come from a JobFactory: EmulatedJobs (the default) builds EngineJobs
for the emulated engine and leaves the KV to the router as above. A factory
whose `owns_kv` is true (torch_engine.TorchJobs) serves an engine that reads
and writes real KV through the kvstores itself: the router then stores
nothing, and books what the engine really reused (its cached and fetched
tokens after admission, replica reads among the local ones) rather than the
route's estimate.

Routing goes through the routing client a router embeds
(services/client/routing.py, docs/client.md): Route within its deadline,
and when the scheduler is slow or down the client's own fallback (prefix
affinity, bounded load), so a request never fails for want of the
scheduler. A fallback route knows nothing cached; the router then asks the
chosen node's kvstore which leading blocks of the prompt it holds (Lookup),
as the node's engine would find them through its connector, and runs the
request with those cached.

Turn ends: with a TurnEndReporter (services/client/reports.py), every
request that finishes is reported to the predictor as a turn end of its
conversation (ReportTurnEnds, batched on the reporter's thread, never on
the request path), which is what session-return foresight needs from a
router (README.md, the predictor).

Failures: a route to an unhealthy engine is retried up to `route_attempts` times; a node that
fails (its kvstore refuses the blocks, or its engine is marked failed) gets
no more work, and a request routed to a failed node is re-routed, then
falls back to the least-loaded healthy engine (recomputing its prefix).

Node death (issue 27): `node_died(node)` kills the node's engine and
re-sends every request it took down, by migration.py's rule (from the start
before the first token, with the streamed tokens appended during decode, at
most `migration_limit` times; one more loss fails the request), and returns
how many it re-sent and lost. Events of an attempt that was re-sent are
ignored, so a request completes once.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Protocol

import grpc
import numpy as np

from speckv.loadgen.engines.driver import LiveEngines
from speckv.loadgen.engines.emulated import EngineEvent, EngineEventKind, EngineJob, job_times
from speckv.loadgen.experiments.metrics import RequestRecord, request_key
from speckv.loadgen.experiments.migration import DEFAULT_MIGRATION_LIMIT, Flight, MigrationCounts, resend, touched_by
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger
from speckv.services.client.reports import TurnEndReporter
from speckv.services.client.routing import ClientSettings, Routed, RouteSource, RoutingClient
from speckv.services.common.engine_profile import EngineProfile
from speckv.services.common.errors import Unavailable
from speckv.services.common.traces import TraceRequest
from speckv.v1 import kvstore_pb2, kvstore_pb2_grpc

log = logging.getLogger(__name__)
# The routing client's settings when the caller gives no client: a Route deadline of 5 s (what the router
# allowed before it had a client), so on a loaded machine a slow answer is still the scheduler's and the
# benches measure its routing; a scheduler that is down or refuses falls back at once all the same.
CLIENT_SETTINGS = ClientSettings(deadline_s=5.0)


def block_payload(block_hash: int, nbytes: int) -> bytes:
    """Deterministic bytes for a block, so a copy can be checked byte-exact."""
    words = np.full(nbytes // 8, block_hash * 0x9E3779B97F4A7C15 % (1 << 64), dtype=np.uint64)
    return words.tobytes() + bytes(nbytes % 8)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request runs and what the route said it may skip, in the
    request's tokens: cached on node_id, then fetched from fetch_from (empty:
    no pull). cached + fetched <= prompt - 1. Of the cached tokens,
    promoted_tokens were in the node's host tier alone and were promoted."""

    node_id: str
    cached_tokens: int
    fetched_tokens: int
    fetch_from: str
    promoted_tokens: int = 0


class JobFactory(Protocol):
    """Turns a routed trace request into its engine's job."""

    @property
    def owns_kv(self) -> bool:
        """True when the engine reads and stores the request's KV itself."""
        ...

    def make_job(self, request_id: str, request: TraceRequest, output_tokens: int,
                 placement: Placement) -> EngineJob: ...

    def solo_prefill_ms(self, job: EngineJob) -> float:
        """The finished job's prefill time alone on an idle engine (ms of the
        engine's clock): what TTFT holds beyond queueing and the pull."""
        ...


class EmulatedJobs:
    """Jobs of the emulated engine: costs from the profile, pulls priced in
    the real model's bytes."""

    owns_kv = False

    def __init__(self, profile: EngineProfile, real_bytes_per_token: int) -> None:
        self._profile, self._real_bytes_per_token = profile, real_bytes_per_token

    def make_job(self, request_id: str, request: TraceRequest, output_tokens: int,
                 placement: Placement) -> EngineJob:
        return EngineJob(request_id, request.prompt_tokens, output_tokens, cached_tokens=placement.cached_tokens,
                         fetch_tokens=placement.fetched_tokens,
                         fetch_bytes=placement.fetched_tokens * self._real_bytes_per_token,
                         promote_bytes=placement.promoted_tokens * self._real_bytes_per_token)

    def solo_prefill_ms(self, job: EngineJob) -> float:
        skipped = job.cached_tokens + job.fetch_tokens
        return self._profile.prefill_ms(job.prompt_tokens - skipped, skipped)


class ReferenceRouter:
    def __init__(self, scheduler: grpc.Channel, kvstores: Mapping[str, grpc.Channel], engines: LiveEngines,
                 profile: EngineProfile, ledger: ReplicaLedger, ledger_lock: threading.Lock,
                 stored_bytes_per_block: int, real_bytes_per_token: int,
                 on_done: Callable[[RequestRecord], None] = lambda _: None, workers: int = 8,
                 route_attempts: int = 3, jobs: JobFactory | None = None,
                 turn_ends: TurnEndReporter | None = None,
                 migration_limit: int = DEFAULT_MIGRATION_LIMIT, client: RoutingClient | None = None) -> None:
        """jobs: the engine's job factory (None: EmulatedJobs of `profile`);
        turn_ends: where finished turns are reported (None: nowhere); the
        router closes it. migration_limit: re-sends a request may have.
        client: the routing client (None: one on `scheduler` with the
        kvstores' nodes and CLIENT_SETTINGS); the router closes it."""
        self.client = client or RoutingClient(scheduler, nodes={n: "" for n in kvstores}, settings=CLIENT_SETTINGS)
        self._kvstores = {n: kvstore_pb2_grpc.KVStoreStub(c) for n, c in kvstores.items()}
        self._engines = engines
        self._jobs: JobFactory = jobs or EmulatedJobs(profile, real_bytes_per_token)
        self._ledger, self._ledger_lock = ledger, ledger_lock
        self._block_bytes = stored_bytes_per_block
        self._on_done, self._attempts = on_done, route_attempts
        self._turn_ends = turn_ends
        self._pool = futures.ThreadPoolExecutor(workers, thread_name_prefix="router")
        self._store_pool = futures.ThreadPoolExecutor(2, thread_name_prefix="store")
        self._lock = threading.Lock()
        self._inflight: dict[str, Flight] = {}  # request id -> its current attempt
        self._migration_limit = migration_limit
        self.records: list[RequestRecord] = []
        self.jobs: dict[str, EngineJob] = {}  # request id -> its job, once dispatched (output ids of real engines)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._store_pool.shutdown(wait=True)
        self.client.close()
        if self._turn_ends is not None:
            self._turn_ends.close()

    def pending(self) -> int:
        with self._lock:
            return len(self._inflight)

    def send(self, index: int, request: TraceRequest) -> None:
        """Hands the request to the pool and returns at once (open loop)."""
        record = RequestRecord(request_key(index), request.arrival_s, request.family, request.prompt_tokens,
                               max(1, request.output_tokens))
        flight = Flight(record, request)
        with self._lock:
            self.records.append(record)
            self._inflight[record.request_id] = flight
        self._pool.submit(self._dispatch, flight)

    def add_node(self, node_id: str, kvstore: grpc.Channel) -> None:
        """A node that joined: its kvstore (its engine is LiveEngines.add's)."""
        self._kvstores[node_id] = kvstore_pb2_grpc.KVStoreStub(kvstore)
        self.client.add_node(node_id, "")

    def node_died(self, node_id: str) -> MigrationCounts:
        """The node's engine and kvstore are gone: kills its engine and
        re-sends (or fails) each request it took down (module docstring)."""
        self._engines.kill(node_id)
        self.client.mark_down(node_id)
        now = self._engines.now()
        counts = MigrationCounts()
        again: list[Flight] = []
        failed: list[RequestRecord] = []
        with self._lock:
            for flight in [f for f in self._inflight.values() if touched_by(f, node_id, now)]:
                record = flight.record
                request = resend(record, flight.request, flight.job, flight.attempt, self._migration_limit)
                if request is None:
                    counts.lost += 1
                    del self._inflight[record.request_id]
                    failed.append(record)
                    continue
                counts.resent += 1
                self._inflight[record.request_id] = next_flight = flight.next_attempt(request)
                again.append(next_flight)
        for record in failed:
            self.client.done(record.request_id)
            self._on_done(record)
        for flight in again:
            self._pool.submit(self._dispatch, flight)
        return counts

    # --- request path -----------------------------------------------------------
    def _dispatch(self, flight: Flight) -> None:
        record, request = flight.record, flight.request
        try:
            route = self._route(record, request)
        except Unavailable as exc:  # no scheduler, and the client knows no node that is up
            self._finish_error(record, f"route: {exc}")
            return
        node = route.node_id
        if not self._engines.healthy(node):
            record.retried = True
            node = self._engines.least_loaded({node}) or ""
            if not node:
                self._finish_error(record, "no healthy engine")
                return
            self.client.moved(record.request_id, node, request.prompt_tokens)
            cached_blocks, fetch_blocks, fetch_from, promote_blocks, disk_blocks = 0, 0, "", 0, 0
        else:
            cached_blocks, fetch_blocks, fetch_from = route.cached_blocks, route.fetch_blocks, route.fetch_from_node
            promote_blocks = self._promote(record, request, node, cached_blocks) if route.promote_blocks else 0
            disk_blocks = min(route.disk_blocks, promote_blocks)  # the scheduler's count: read off the disk first
            if route.source is RouteSource.FALLBACK:
                cached_blocks = self._held_prefix(record, request, node)
        if not self._jobs.owns_kv:
            self._note_replica_reads(record, request, node, cached_blocks)
        block = request.block_tokens
        cached = min(cached_blocks * block, request.prompt_tokens - 1)
        fetched = min(fetch_blocks * block, request.prompt_tokens - 1 - cached) if fetch_from else 0
        record.node_id, record.cached_tokens, record.fetched_tokens, record.fetch_from = node, cached, fetched, fetch_from
        record.promoted_tokens = min(promote_blocks * block, cached)
        record.disk_tokens = min(disk_blocks * block, record.promoted_tokens)
        job = self._jobs.make_job(record.request_id, request, max(1, request.output_tokens),
                                  Placement(node, cached, fetched, fetch_from, record.promoted_tokens))
        with self._lock:
            if self._inflight.get(record.request_id) is not flight:
                return  # re-sent or failed while it was being routed
            flight.fetch_from, flight.job = fetch_from, job
            self.jobs[record.request_id] = job
        if not self._engines.submit(node, job):
            # The node died between the route and here. Unless its death already re-sent this
            # attempt, the attempt is routed again (no migration: nothing ran there).
            with self._lock:
                current = self._inflight.get(record.request_id) is flight
                if current:
                    flight.job = None
            if current:
                record.retried = True
                self._dispatch(flight)
            return
        if flight.first_submitted_s is None:
            flight.first_submitted_s = job.submitted_s

    def _promote(self, record: RequestRecord, request: TraceRequest, node: str, cached_blocks: int) -> int:
        """Has the node's kvstore copy the prefix's host-only blocks into its
        device tier (KVStore.Promote); returns how many it copied. A failure
        (the blocks left meanwhile) promotes nothing: the engine's time then
        counts no promotion, as for a pull whose source lost its blocks."""
        hashes = list(request.block_hashes[:cached_blocks])
        try:
            reply = self._kvstores[node].Promote(kvstore_pb2.PromoteRequest(block_hashes=hashes), timeout=30.0)
        except grpc.RpcError as exc:
            log.info("promotion for %s on %s: %s", record.request_id, node, exc.code().name)
            return 0
        return reply.promoted

    def _note_replica_reads(self, record: RequestRecord, request: TraceRequest, node: str, cached_blocks: int) -> None:
        hashes = request.block_hashes[:request.full_blocks]
        with self._ledger_lock:
            record.replica_blocks = self._ledger.note_read(node, hashes[:cached_blocks], request.arrival_s)

    def _held_prefix(self, record: RequestRecord, request: TraceRequest, node: str) -> int:
        """Leading blocks of the prompt the node's kvstore holds (KVStore.Lookup);
        0 when it does not answer (the engine then recomputes them)."""
        hashes = list(request.block_hashes[:request.full_blocks])
        if not hashes or node not in self._kvstores:
            return 0
        try:
            reply = self._kvstores[node].Lookup(kvstore_pb2.LookupRequest(block_hashes=hashes), timeout=5.0)
        except grpc.RpcError as exc:
            log.info("lookup for %s on %s: %s", record.request_id, node, exc.code().name)
            return 0
        return reply.prefix_blocks

    def _route(self, record: RequestRecord, request: TraceRequest) -> Routed:
        """The client's route (the scheduler's, or its fallback's); one to an
        unhealthy engine is asked again, up to route_attempts in all."""
        hashes = list(request.block_hashes[:request.full_blocks])
        for attempt in range(self._attempts):
            started = time.perf_counter()
            route = self.client.route(record.request_id, hashes, request.prompt_tokens, request.family)
            record.route_ms = (time.perf_counter() - started) * 1e3
            record.expected_ttft_ms = route.expected_ttft_ms
            if self._engines.healthy(route.node_id) or attempt == self._attempts - 1:
                return route
            record.retried = True
            self.client.mark_down(route.node_id)
        raise AssertionError("unreachable")

    # --- engine events ---------------------------------------------------------
    def on_engine_events(self, events: list[EngineEvent]) -> None:
        for event in events:
            with self._lock:
                flight = self._inflight.get(event.job.request_id)
                if flight is None or flight.job is not event.job:
                    continue  # finished, failed, or an attempt that was re-sent
                if event.kind is EngineEventKind.FIRST_TOKEN and flight.first_token_s is None:
                    flight.first_token_s = event.job.first_token_s
            record, request, fetch_from = flight.record, flight.request, flight.fetch_from
            if event.kind is EngineEventKind.FIRST_TOKEN and self._jobs.owns_kv:
                self._book_engine_reuse(record, request, event.job)
            elif event.kind is EngineEventKind.FIRST_TOKEN:
                self._store_pool.submit(self._store_blocks, record, request, fetch_from)
            elif getattr(event.job, "error", ""):  # a real engine's request failed (vllm_server.VllmJob)
                self._finish_error(record, event.job.error)
            else:
                times = job_times(event.job, self._jobs.solo_prefill_ms(event.job))
                record.ttft_ms, record.tpot_ms, record.e2e_ms = times.ttft_ms, times.tpot_ms, times.e2e_ms
                record.queue_ms = times.queue_ms
                if flight.attempt and flight.first_submitted_s is not None and flight.first_token_s is not None:
                    # A re-sent request: the client waited from its first submission.
                    job = event.job
                    record.ttft_ms = (flight.first_token_s - flight.first_submitted_s) * 1e3
                    record.e2e_ms = ((job.finished_s or job.submitted_s) - flight.first_submitted_s) * 1e3
                if self._turn_ends is not None and event.job.finished_s is not None:
                    self._turn_ends.offer(request.family, request.arrival_s, event.job.finished_s,
                                          record.prompt_tokens, record.output_tokens, request.follow_ups)
                self._complete(record)

    def _book_engine_reuse(self, record: RequestRecord, request: TraceRequest, job: EngineJob) -> None:
        """The engine's admission decided what was really skipped; a pull the
        engine did not make (the peer lost the blocks) is no fetch."""
        record.cached_tokens, record.fetched_tokens = job.cached_tokens, job.fetch_tokens
        if not job.fetch_tokens:
            record.fetch_from = ""
        self._note_replica_reads(record, request, record.node_id, job.cached_tokens // request.block_tokens)

    def _store_blocks(self, record: RequestRecord, request: TraceRequest, fetch_from: str) -> None:
        hashes = list(request.block_hashes[:request.full_blocks])
        first_new = record.cached_tokens // request.block_tokens
        fetched_upto = (record.cached_tokens + record.fetched_tokens) // request.block_tokens
        if first_new >= len(hashes):
            return
        pulled: dict[int, bytes] = {}
        if fetch_from and fetched_upto > first_new:
            try:
                for block in self._kvstores[fetch_from].GetBlocks(
                        kvstore_pb2.GetBlocksRequest(block_hashes=hashes[first_new:fetched_upto]), timeout=30.0):
                    pulled[block.block_hash] = block.data
            except grpc.RpcError as exc:  # evicted meanwhile: the node recomputed it
                log.info("pull of %s from %s: %s", record.request_id, fetch_from, exc.code().name)

        def blocks() -> Iterator[kvstore_pb2.PutBlockRequest]:
            for i in range(first_new, len(hashes)):
                data = pulled.get(hashes[i]) or block_payload(hashes[i], self._block_bytes)
                yield kvstore_pb2.PutBlockRequest(block_hash=hashes[i], data=data, family=request.family,
                                                  parent_hash=hashes[i - 1] if i else 0, has_parent=i > 0)

        try:
            self._kvstores[record.node_id].PutBlocks(blocks(), timeout=30.0)
        except grpc.RpcError as exc:
            log.warning("node %s refused blocks: %s; no more work goes to it", record.node_id, exc.code().name)
            self._engines.mark_failed(record.node_id)
            self.client.mark_down(record.node_id)

    def _finish_error(self, record: RequestRecord, error: str) -> None:
        record.error = error
        self._complete(record)

    def _complete(self, record: RequestRecord) -> None:
        with self._lock:
            if self._inflight.pop(record.request_id, None) is None:
                return  # already failed (its node died once too often)
        self.client.done(record.request_id)
        self._on_done(record)

