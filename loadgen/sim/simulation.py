"""One policy over one slice of trace, in virtual time: the live cluster's
pieces wired without gRPC.

What runs (the live objects, unchanged): SchedulerCore with its router,
policies, planner, order lifecycle and block index; PredictorCore (builtin
EWMA or LightGBM trained before the slice) when the policy reads forecasts
(FORECAST_POLICIES: predictive; the live cluster runs the predictor for every
policy, but no other policy asks it anything, so their results are the same
without it, and it was a sixth of a `none` run); the emulated engines
(FastEngine = EmulatedEngine with decode stretches jumped exactly); the
kvstore's block index and eviction strategy for each node's tiers (kvnode.py). What is
modelled here instead of a process: the network (network.py), the reference
router's request path, the engines' heartbeats and the kvstore agents'
order execution.

Request path (as loadgen/experiments/reference_router.py does live): at its arrival time a request
is routed (Route confirms the prefix with the chosen node's simulated
kvstore); replica blocks in its cached prefix are counted; the prefix blocks
only the node's host tier holds are promoted (put into its device tier at
once, their bytes over the node's host link, network.py with the host link
model); a pull named by the route moves fetched_tokens x real bytes per
token over the network from the holder at the same time, reading the pulled
blocks only the holder's disk holds off that disk meanwhile (staging.pull); the job is
submitted to the node's engine when both are in (its TTFT counts from the
arrival, promotion and pull included). At the first token the prompt's new
full blocks are stored on the node (STORED / REMOVED events per tier to the
scheduler's index, and the blocks that left the node to the replica ledger);
at the end the record is complete. Demotions cost no time: they run on the
host link's other direction, off the request path.

Orders (scheduler_side.py): every scheduler tick, the orders the policy issued start at once:
IN_FLIGHT, the blocks' real bytes flow source -> target over both links,
then the target stores them as leased replicas in the order's tier
(COMMITTED event) and the order is reported COMMITTED. Orders whose source no longer holds the chain
fail (the lifecycle retries them elsewhere). Unlike the live agent (two
orders at a time per node), every order flows at once and shares the links.

Node events (failover.py): a kill re-sends what the node was serving by the
reference router's rule (migration.resend); an add registers a cold node.

Heartbeats (scheduler_side.py): every heartbeat_s, every node whose engine changed since its
last heartbeat reports its load (queued and running tokens and requests,
free pages); an unchanged node still reports every liveness_s.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

from speckv.loadgen.engines.emulated import EngineEvent, EngineEventKind, EngineJob, job_times
from speckv.loadgen.engines.fast import FastEngine
from speckv.loadgen.experiments.e2e_config import E2EConfig
from speckv.loadgen.experiments.event_metrics import EventOutcome
from speckv.loadgen.experiments.metrics import RequestRecord, request_key
from speckv.loadgen.experiments.migration import DEFAULT_MIGRATION_LIMIT, resend
from speckv.loadgen.experiments.replica_ledger import KVEventKind, ReplicaLedger, ReplicaTotals
from speckv.loadgen.experiments.warm_start import resident_tail
from speckv.loadgen.sim import failover, forecast_wiring, scheduler_side
from speckv.loadgen.sim.ablation import config_without, parse_variant
from speckv.loadgen.sim.event_loop import EventHandle, EventQueue, VirtualClock
from speckv.loadgen.sim.kv_events import outcome_events
from speckv.loadgen.sim.kvnode import PutOutcome, SimKVNode
from speckv.loadgen.sim.membership import Membership
from speckv.loadgen.sim.network import Network, Transfer
from speckv.loadgen.sim.predictor import CoreForecasts, TrainedPredictor
from speckv.loadgen.sim.online_returns import FIT_CHECK_S, SimReturns
from speckv.loadgen.sim.returns import TrainedReturns
from speckv.loadgen.sim.scheduler_side import HEARTBEAT_PRIORITY, TICK_PRIORITY
from speckv.loadgen.sim.settings import SimSettings
from speckv.loadgen.sim.staging import StageReads, pull, stage_up
from speckv.loadgen.workload.node_events import ScheduledEvent
from speckv.services.common.errors import SpeckvError
from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier
from speckv.services.common.traces import TraceRequest
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.forecasts import FutureArrivals, TraceFutureArrivals
from speckv.services.scheduler.holder_index import HolderEventKind
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.ports import SchedulerSettings

Progress = Callable[[int, int, RequestRecord | None], None]


@dataclass(slots=True)
class SimRun:
    """One policy's outcome; the first fields mirror bench/_e2e_run.PolicyRun."""

    policy: str
    records: list[RequestRecord]
    replicas: ReplicaTotals
    orders: dict[str, int]
    forecasts: list[tuple[float, str, float]] = field(default_factory=list)
    wall_s: float = 0.0
    sent: int = 0
    events: int = 0
    virtual_s: float = 0.0
    network_bytes: int = 0
    predictor: str = ""
    cpu_s: float = 0.0  # this process's CPU time for the run: wall_s with other processes' share taken out
    actions: dict[str, dict[str, object]] = field(default_factory=dict)  # action kind -> ActionStats.to_json()
    node_events: list[EventOutcome] = field(default_factory=list)  # node events (kill, add), in time order
    lifetimes: dict[str, tuple[float, float]] = field(default_factory=dict)  # node -> (joined, left), trace s


class _Confirmer:
    """PrefixConfirmer over the simulated kvstores (Lookup touches, as live)."""

    def __init__(self, by_address: dict[str, SimKVNode]) -> None:
        self._by_address = by_address

    def asks(self, address: str) -> bool:
        return True

    def confirm(self, address: str, block_hashes: Sequence[int]) -> int | None:
        node = self._by_address.get(address)
        return None if node is None else node.lookup(block_hashes)


@dataclass(slots=True)
class _Flight:
    """One attempt at serving a request (a re-sent request gets a new one)."""

    record: RequestRecord
    request: TraceRequest  # what this attempt sends (a migrated decode's prompt holds the streamed tokens)
    waiting: int = 0  # copies (promotion, pull) still running before the job can start
    attempt: int = 0  # re-sends before this one
    first_token_s: float | None = None  # the client's first token, from this attempt or an earlier one
    job: EngineJob | None = None


def _copy_done(then: Callable[[_Flight, str], None], flight: _Flight, what: str, _transfer: Transfer) -> None:
    then(flight, what)


class Simulation:
    def __init__(self, config: E2EConfig, settings: SimSettings, policy: str, requests: Sequence[TraceRequest],
                 history: Sequence[TraceRequest] = (), on_progress: Progress | None = None,
                 future: FutureArrivals | None = None, trained: TrainedPredictor | None = None,
                 returns: TrainedReturns | None = None, node_events: Sequence[ScheduledEvent] = (),
                 migration_limit: int = DEFAULT_MIGRATION_LIMIT) -> None:
        """requests: in arrival order (any Sequence; read once each, in order).
        future: the oracle's truth (default: the requests themselves).
        trained: the model of settings.predictor "lightgbm" (predictor.py).
        returns: the session-return model (returns.py) the forecast-reading
        policies also plan on; None: family bursts alone.
        node_events: kills and adds at trace times (membership.py says how
        they play out); migration_limit: re-sends a request may have."""
        self.config, self.settings, self.policy = config, settings, policy
        variant = parse_variant(policy)  # ablation.py: a policy with one action turned off
        self._runs = variant.policy
        policies = load_policy_config()
        if variant.without is not None:
            policies = config_without(policies, variant.without)
        self._requests = requests
        start = requests[0].arrival_s if len(requests) else 0.0
        self.queue = EventQueue(VirtualClock(start))
        self._on_progress = on_progress or (lambda total, done, record: None)
        wiring = forecast_wiring.wire(variant.policy, settings, policies, self.queue.clock, trained, returns,
                                      history, start)
        self._forecasts, self._returns, self.predictor_note = wiring.forecasts, wiring.returns, wiring.note
        self._refits = wiring.refits
        arrivals, source = wiring.arrivals, wiring.source
        self.ids = [NodeId(f"node-{i}") for i in range(settings.nodes)]
        sizes = settings.sizes
        self.kv = {n: self._new_kv(n) for n in self.ids}
        addresses = self._addresses = {n: f"sim-{n}:{i + 1}" for i, n in enumerate(self.ids)}
        self._by_address = {addresses[n]: self.kv[n] for n in self.ids}
        host_link = config.host_link if sizes.host_pages else None
        if sizes.host_pages and host_link is None:
            raise ValueError("a host tier (host_pages > 0) needs the configuration's host link")
        disk = settings.disk if settings.disk_pages else None
        self.core = SchedulerCore(
            SchedulerSettings(node_timeout_s=settings.node_timeout_s, policy=variant.policy, policy_config=policies,
                              link_gbps=config.link.gbps,
                              link_overhead_ms=config.link.overhead_ms,
                              host_link_gbps=host_link.gbps if host_link else 0.0,
                              host_link_overhead_ms=host_link.overhead_ms if host_link else 0.0,
                              disk_gbps=disk.gbps if disk else 0.0, disk_overhead_ms=disk.overhead_ms if disk else 0.0),
            self.queue.clock, config.profile, confirmer=_Confirmer(self._by_address),
            arrivals=arrivals, forecasts=source,
            future=future if future is not None else TraceFutureArrivals(list(requests)))
        self._gen = {}
        for n in self.ids:
            self.core.register_node(n, addresses[n], sizes, config.real_geometry)
            self._gen[n] = self.core.generation(n)
        self.engines = {n: FastEngine(n, config.profile, config.engine, config.link,
                                      config.real_geometry.bytes_per_token) for n in self.ids}
        self.network = Network(self.queue, config.link)
        self.host_links = Network(self.queue, host_link) if host_link is not None else None
        self.disk_links = Network(self.queue, disk) if disk is not None else None
        self.stage_reads = StageReads()  # the stage orders' reads in flight, joined by what needs their blocks
        self.ledger = ReplicaLedger()
        self.records: list[RequestRecord] = []
        self.forecast_log: list[tuple[float, str, float]] = []
        self._inflight: dict[str, _Flight] = {}
        self._wakes: dict[NodeId, EventHandle | None] = {n: None for n in self.ids}
        self._dirty: set[NodeId] = set()
        self._last_beat = {n: start for n in self.ids}
        self._next = 0
        self._done = 0
        self._upcoming: TraceRequest | None = None
        self.membership = Membership(migration_limit, tracking=bool(node_events))
        for n in self.ids:
            self.membership.lifetimes[n] = (-math.inf, math.inf)
        self._node_events = list(node_events)
        self._warm_start(history)

    def _warm_start(self, history: Sequence[TraceRequest]) -> None:
        """The live run's warm start (bench/_e2e_warm.py), in virtual time:
        every pre-slice request is routed at the slice's start with its own
        arrival time (so the predictor observes it through the scheduler, as
        live), and the newest requests' new full blocks, up to
        warm_kv_fraction of the cluster's pages, are stored where they were
        routed (device tiers first; with host tiers, older blocks are demoted
        into them as the cluster would have demoted them, and the fraction is
        of both tiers' pages)."""
        pages = self.settings.sizes.device_pages + self.settings.sizes.host_pages
        max_blocks = int(self.config.warm_kv_fraction * self.settings.nodes * pages)
        first_stored = resident_tail(history, max_blocks)
        now = self.queue.now()
        for i, r in enumerate(history):
            hashes = list(r.block_hashes[:r.full_blocks])
            route = self.core.route(f"warm-{i}", hashes, r.prompt_tokens, r.family, arrival_time_s=r.arrival_s)
            cached = route.cached_blocks
            if i < first_stored or cached >= len(hashes):
                continue
            node = NodeId(route.node_id)
            self._apply(node, self.kv[node].put(hashes[cached:], now), hashes[0], r.family, now)

    # --- running ------------------------------------------------------------------
    def run(self) -> SimRun:
        began, began_cpu = time.perf_counter(), time.process_time()
        q = self.queue
        if self._requests:
            self._upcoming = self._requests[0]
            q.at(self._upcoming.arrival_s, self._arrive)
        q.after(self.settings.tick_s, partial(scheduler_side.tick, self), TICK_PRIORITY)
        q.after(self.settings.heartbeat_s, partial(scheduler_side.heartbeat_round, self), HEARTBEAT_PRIORITY)
        if self._forecasts is not None:
            q.after(self.settings.forecast_poll_s, partial(scheduler_side.poll_forecasts, self), TICK_PRIORITY)
        for event in self._node_events:
            q.at(event.at_s, partial(failover.node_event, self, event), TICK_PRIORITY)
        if self._returns is not None and self._returns.fitter is not None:
            q.after(FIT_CHECK_S, self._fit_tick, TICK_PRIORITY)
        if self._refits is not None:
            q.after(self._refits.interval_s, self._refit_tick, TICK_PRIORITY)
        deadline = (self._requests[-1].arrival_s if self._requests else q.now()) + self.settings.drain_s
        total = len(self._requests)
        q.run(until_s=deadline, stop=lambda: self._done >= total)
        if self._returns is not None and self._returns.fitter is not None:
            self.predictor_note += f"; {self._returns.note()}"
        if self._refits is not None:
            self.predictor_note += f"; {self._refits.note()}"
            self._refits.close()
        for record in self.records:
            if not record.served and not record.error:
                record.error = "not finished before the drain deadline"
        orders = {state.name: n for state, n in self.core.order_counts().items()}
        actions = {kind.value: stats.to_json() for (policy, kind), stats in self.core.action_outcomes().items()
                   if policy == self._runs}
        return SimRun(self.policy, self.records, self.ledger.totals(), orders, self.forecast_log,
                      time.perf_counter() - began, self._next, q.processed,
                      q.now() - (self._requests[0].arrival_s if self._requests else q.now()),
                      self.network.bytes_total, self.predictor_note, time.process_time() - began_cpu, actions,
                      self.membership.outcomes, self.membership.lifetimes)

    def _refit_tick(self) -> None:
        assert self._refits is not None
        self._refits.tick(self.queue.now())
        self.queue.after(self._refits.interval_s, self._refit_tick, TICK_PRIORITY)

    def _fit_tick(self) -> None:
        assert self._returns is not None
        self._returns.tick(self.queue.now())
        self.queue.after(FIT_CHECK_S, self._fit_tick, TICK_PRIORITY)

    # --- requests -------------------------------------------------------------------
    def _arrive(self) -> None:
        i, request = self._next, self._upcoming
        assert request is not None  # run() schedules _arrive only with a request upcoming
        self._next += 1
        if self._next < len(self._requests):
            self._upcoming = self._requests[self._next]
            self.queue.at(self._upcoming.arrival_s, self._arrive)
        record = RequestRecord(request_key(i), request.arrival_s, request.family, request.prompt_tokens,
                               max(1, request.output_tokens))
        self.records.append(record)
        if self._returns is not None:
            self._returns.arrival(request.family, request.arrival_s, request.prompt_tokens)
        if self.membership.kills:
            self.membership.arrived(record.request_id, request.block_hashes)
        self._dispatch(_Flight(record, request))

    def _dispatch(self, flight: _Flight) -> None:
        """Routes one attempt and starts it: its promotion and pull, then its job."""
        record, request = flight.record, flight.request
        hashes = list(request.block_hashes[:request.full_blocks])
        try:
            route = self.core.route(record.request_id, hashes, request.prompt_tokens, request.family)
        except SpeckvError as exc:
            record.error = f"route: {exc}"
            self._complete(record)
            return
        node = route.node_id
        record.expected_ttft_ms = route.expected_ttft_ms
        record.replica_blocks = self.ledger.note_read(node, hashes[:route.cached_blocks])
        block = request.block_tokens
        cached = min(route.cached_blocks * block, request.prompt_tokens - 1)
        fetched = min(route.fetch_blocks * block, request.prompt_tokens - 1 - cached) if route.fetch_from else 0
        record.node_id, record.cached_tokens, record.fetched_tokens = node, cached, fetched
        record.fetch_from = route.fetch_from or ""
        self._inflight[record.request_id] = flight
        promoted = self._promote(node, hashes[:route.cached_blocks], request, flight)
        record.promoted_tokens = min(promoted * block, cached)
        if fetched:
            flight.waiting += 1
            nbytes = fetched * self.config.real_geometry.bytes_per_token
            pulled = hashes[route.cached_blocks:route.cached_blocks + route.fetch_blocks]
            pull(self, NodeId(record.fetch_from), node, pulled, nbytes,
                 partial(_copy_done, self._copied, flight, "pull"))
        if not flight.waiting:
            self._submit(flight)

    def _promote(self, node: NodeId, prefix: list[int], request: TraceRequest, flight: _Flight) -> int:
        """Puts the prefix blocks only node's host tier holds into its device
        tier now and starts their copy over its host link; returns how many."""
        kv = self.kv[node]
        promoted = kv.host_only(prefix, len(prefix))
        if not promoted or self.host_links is None:
            return 0
        from_disk, now = kv.disk_only_hashes(prefix, len(prefix)), self.queue.now()
        flight.record.disk_tokens = len(from_disk) * request.block_tokens
        self._apply(node, kv.put(prefix, now, promote=True), prefix[0], request.family, now)
        flight.waiting += 1
        stage_up(self, node, promoted, from_disk, partial(_copy_done, self._copied, flight, "promote"))
        return promoted

    def _copied(self, flight: _Flight, what: str) -> None:
        """A promotion or a pull of flight is in; the last one submits its job."""
        record = flight.record
        if self._inflight.get(record.request_id) is not flight:
            return  # the attempt was re-sent (a node it needed died) or has failed
        waited_ms = (self.queue.now() - record.arrival_s) * 1e3
        if what == "promote":
            record.promote_ms = waited_ms
        else:
            record.fetch_ms = waited_ms
        flight.waiting -= 1
        if not flight.waiting:
            self._submit(flight)

    def _submit(self, flight: _Flight) -> None:
        record, request = flight.record, flight.request
        node = NodeId(record.node_id)
        engine = self.engines[node]
        now = self.queue.now()
        self._handle(node, engine.advance(now))
        flight.job = EngineJob(record.request_id, request.prompt_tokens, max(1, request.output_tokens),
                               cached_tokens=record.cached_tokens + record.fetched_tokens)
        engine.submit(flight.job, now)
        self._dirty.add(node)
        self._wake(node)

    def _wake(self, node: NodeId) -> None:
        t = self.engines[node].next_event_s()
        old = self._wakes[node]
        if old is not None:
            if t is not None and old.time_s == t and not old.cancelled:
                return
            old.cancel()
        self._wakes[node] = None if t is None else self.queue.at(max(t, self.queue.now()),
                                                                  lambda: self._engine_due(node))

    def _engine_due(self, node: NodeId) -> None:
        self._wakes[node] = None
        if node in self.membership.dead:
            return
        self._handle(node, self.engines[node].advance(self.queue.now()))
        self._dirty.add(node)
        self._wake(node)

    def _handle(self, node: NodeId, events: list[EngineEvent]) -> None:
        for event in events:
            flight = self._inflight.get(event.job.request_id)
            if flight is None or flight.job is not event.job:
                continue
            if event.kind is EngineEventKind.FIRST_TOKEN:
                if flight.first_token_s is None:
                    flight.first_token_s = event.job.first_token_s
                self._store(node, flight)
            else:
                self._finish(flight, event)

    def _store(self, node: NodeId, flight: _Flight) -> None:
        request, record = flight.request, flight.record
        hashes = list(request.block_hashes[:request.full_blocks])
        first_new = record.cached_tokens // request.block_tokens
        if first_new >= len(hashes):
            return
        now = self.queue.now()
        self.membership.prefilled(hashes[first_new:], request.block_tokens)
        self._apply(node, self.kv[node].put(hashes[first_new:], now), hashes[0], request.family, now)

    def _finish(self, flight: _Flight, event: EngineEvent) -> None:
        record, request, job = flight.record, flight.request, event.job
        skipped = record.cached_tokens + record.fetched_tokens
        solo = self.config.profile.prefill_ms(request.prompt_tokens - skipped, skipped)
        times = job_times(job, solo)
        assert job.first_token_s is not None and job.finished_s is not None  # a FINISHED event's job
        first_token_s = flight.first_token_s if flight.first_token_s is not None else job.first_token_s
        record.ttft_ms = (first_token_s - record.arrival_s) * 1e3
        record.tpot_ms = times.tpot_ms
        record.e2e_ms = (job.finished_s - record.arrival_s) * 1e3
        record.queue_ms = max(0.0, record.ttft_ms - (job.submitted_s - record.arrival_s) * 1e3 - solo)
        if self._returns is not None:
            self._returns.turn_end(request.family, job.finished_s, record.arrival_s, request.prompt_tokens,
                                   request.output_tokens, float(request.follow_ups))
        self._complete(record)

    def _complete(self, record: RequestRecord) -> None:
        self._inflight.pop(record.request_id, None)
        self._done += 1
        self._on_progress(len(self._requests), self._done, record)

    # --- KV events --------------------------------------------------------------------
    def _apply(self, node: NodeId, out: PutOutcome, root: int, family: str, now: float,
               kind: HolderEventKind = HolderEventKind.STORED, tier: Tier = Tier.DEVICE) -> None:
        """The events a put's outcome makes, in the order that leaves the
        index in the node's final state (kvnode.PutOutcome), in one index
        call (kv_events.py); the blocks that left the node go to the replica
        ledger."""
        events = outcome_events(out, root, family, kind, tier)
        if events:
            self.core.apply_kv_events(node, self._gen[node], events)
        if out.stored:
            self.membership.stored(node, root, family)
        if out.dropped:
            self.ledger.apply(node, KVEventKind.REMOVED, out.dropped, now)

    # --- node events (failover.py runs kills and adds) ------------------------------------
    def _new_kv(self, node: NodeId) -> SimKVNode:
        sizes = self.settings.sizes
        return SimKVNode(node, sizes.device_pages, sizes.host_pages, sizes.retain_max_blocks or 0,
                         self.settings.disk_pages)

    def _alive(self) -> list[NodeId]:
        return [n for n in self.ids if n not in self.membership.dead]

    def _resend(self, flight: _Flight, outcome: EventOutcome) -> None:
        """The reference router's migration: before the first token the
        request goes again from the start; during decode, with the tokens
        streamed so far appended to its prompt and only the rest to generate.
        Past the migration limit it fails (lost)."""
        record = flight.record
        self._inflight.pop(record.request_id, None)
        again = resend(record, flight.request, flight.job, flight.attempt, self.membership.migration_limit)
        if again is None:
            outcome.requests_lost += 1
            self._complete(record)
            return
        outcome.requests_resent += 1
        self._dispatch(_Flight(record, again, attempt=flight.attempt + 1, first_token_s=flight.first_token_s))
