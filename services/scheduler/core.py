"""SchedulerCore: the facade the servicer calls. Pure Python, thread-safe.

One lock guards the cluster, the block index, the orders and the router, so
every RPC sees a consistent picture; nothing blocking runs under it. The two
remote consultations go through small interfaces injected by the server:
- PrefixConfirmer: after the router picks a node, Route confirms the cached
  prefix with that node's kvstore (outside the lock). When it does not answer
  the index's figure stands and the result says `confirmed=False`.
- ArrivalSink: every routed request is offered as an arrival (never blocks).
A NodeListener hears about (re-)registrations so the server can (re)start
that node's KV event stream.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import Protocol, Sequence

from speckv.services.common.clock import Clock
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, SpeckvError, Unavailable
from speckv.services.scheduler.arrivals import ArrivalRecord
from speckv.services.scheduler.block_index import BlockIndex, IndexEvent
from speckv.services.scheduler.cluster import Cluster, Node, NodeLoad
from speckv.services.scheduler.engine_profile import EngineProfile, LinkModel
from speckv.services.common.geometry import KVGeometry
from speckv.services.scheduler.ids import UINT64_MAX, Family, NodeId, default_family
from speckv.services.scheduler.order_feed import OrderFeed, Watcher
from speckv.services.scheduler.orders import Order, OrderSpec, OrderState, OrderTracker, validate_spec
from speckv.services.scheduler.policies.base import ClusterView, NodeView, Policy
from speckv.services.scheduler.policies.registry import PolicyRegistry, default_registry
from speckv.services.scheduler.router import Candidate, KvAwareRouter, RouteQuery, best_holder, uncached_tokens

log = logging.getLogger(__name__)


class PrefixConfirmer(Protocol):
    def confirm(self, address: str, block_hashes: Sequence[int]) -> int | None: ...


class ArrivalSink(Protocol):
    def offer(self, arrival: ArrivalRecord) -> bool: ...


class NodeListener(Protocol):
    def node_registered(self, node_id: NodeId, address: str, generation: int, old_address: str | None) -> None: ...


@dataclass(frozen=True, slots=True)
class CoreSettings:
    node_timeout_s: float = 5.0
    heartbeat_interval_ms: int = 1000
    policy: str = "none"
    link_gbps: float = 25.0
    link_overhead_ms: float = 1.0
    router_seed: int = 0
    tie_ms: float = 1.0
    watch_queue: int = 1024


@dataclass(slots=True)
class RouteResult:
    node_id: NodeId
    address: str
    cached_blocks: int
    expected_ttft_ms: float
    queue_ms: float
    prefill_ms: float
    fetch_ms: float
    fetch_from: NodeId | None
    fetch_blocks: int
    family: Family
    confirmed: bool


@dataclass(frozen=True, slots=True)
class NodeReport:
    view: NodeView
    last_heartbeat_age_s: float
    routes_total: int


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    nodes: tuple[NodeReport, ...]
    policy: str
    order_counts: dict[OrderState, int]
    num_families: int
    now: float


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    name: str
    available: tuple[str, ...]
    description: str


class SchedulerCore:
    def __init__(self, settings: CoreSettings, clock: Clock, profile: EngineProfile,
                 registry: PolicyRegistry | None = None, confirmer: PrefixConfirmer | None = None,
                 arrivals: ArrivalSink | None = None, listener: NodeListener | None = None) -> None:
        self.settings = settings
        self._clock = clock
        self._profile = profile
        self._registry = registry or default_registry()
        self._policy: Policy = self._registry.create(settings.policy)
        self._confirmer, self._arrivals, self._listener = confirmer, arrivals, listener
        self._cluster = Cluster(settings.node_timeout_s)
        self._index = BlockIndex()
        self._orders = OrderTracker()
        self._feed = OrderFeed(settings.watch_queue)
        self._router = KvAwareRouter(profile, LinkModel(settings.link_gbps, settings.link_overhead_ms),
                                     settings.router_seed, settings.tie_ms)
        self._lock = threading.Lock()
        self._unconfirmed: set[str] = set()  # addresses whose last Lookup failed (log transitions only)

    # --- nodes -----------------------------------------------------------
    def register_node(self, node_id: str, address: str, capacity_pages: int,
                      geometry: KVGeometry | None) -> tuple[bool, int]:
        """Returns (re_registered, heartbeat_interval_ms)."""
        with self._lock:
            old = self._cluster.find(NodeId(node_id))
            old_address = old.address if old else None
            node, again = self._cluster.register(NodeId(node_id), address, capacity_pages,
                                                 geometry or self._profile.geometry, self._clock.now())
            self._index.drop_node(node.node_id)
            generation = node.generation
        log.info("node %s %sregistered at %s", node_id, "re-" if again else "", address)
        if self._listener is not None:
            self._listener.node_registered(NodeId(node_id), address, generation, old_address)
        return again, self.settings.heartbeat_interval_ms

    def heartbeat(self, node_id: str, load: NodeLoad) -> bool:
        with self._lock:
            node = self._cluster.find(NodeId(node_id))
            was_down = node is not None and not self._cluster.is_alive(node, self._clock.now())
            known = self._cluster.heartbeat(NodeId(node_id), load, self._clock.now())
        if was_down:
            log.info("node %s is back", node_id)
        return known

    def apply_kv_event(self, node_id: NodeId, generation: int, event: IndexEvent) -> bool:
        """Applies one KV event; False when generation is stale (node re-registered)."""
        with self._lock:
            node = self._cluster.find(node_id)
            if node is None or node.generation != generation:
                return False
            self._index.apply(node_id, event)
            return True

    def reset_inventory(self, node_id: NodeId, generation: int) -> bool:
        with self._lock:
            node = self._cluster.find(node_id)
            if node is None or node.generation != generation:
                return False
            self._index.drop_node(node_id)
            return True

    # --- routing ---------------------------------------------------------
    def route(self, request_id: str, block_hashes: Sequence[int], prompt_tokens: int,
              family: str = "", arrival_time_s: float = 0.0) -> RouteResult:
        hashes = list(block_hashes)
        _validate_route(hashes, prompt_tokens)
        if not arrival_time_s >= 0:
            raise InvalidArgument(f"arrival_time_s={arrival_time_s}: must be >= 0 (0: the scheduler's clock)")
        query = RouteQuery(request_id, hashes, prompt_tokens, Family(family) if family else default_family(hashes))
        with self._lock:
            now = self._clock.now()
            block_size = self._cluster.block_size()
            if block_size and len(hashes) * block_size > prompt_tokens:
                raise InvalidArgument(f"{len(hashes)} block hashes of {block_size} tokens exceed "
                                      f"prompt_tokens={prompt_tokens}")
            candidates = self._candidates(hashes, now)
            if not candidates:
                raise Unavailable("no live node to route to")
            decision = self._router.choose(query, candidates)
            node = self._cluster.get(decision.node_id)
            address, node_block_size = node.address, node.geometry.block_size
            self._cluster.add_pending(node.node_id, uncached_tokens(decision, query, node_block_size))
            if hashes:
                self._index.note_family(query.family, hashes[0])
        confirmed = self._confirm(address, hashes)
        if confirmed is not None and confirmed != decision.cached_blocks:
            chosen = next(c for c in candidates if c.node_id == decision.node_id)
            others = [c for c in candidates if c.node_id != decision.node_id]
            decision = self._router.estimate(query, replace(chosen, cached_blocks=confirmed), best_holder(others))
        result = RouteResult(decision.node_id, address, decision.cached_blocks, decision.expected_ttft_ms,
                             decision.queue_ms, decision.prefill_ms, decision.fetch_ms, decision.fetch_from,
                             decision.fetch_blocks, query.family, confirmed is not None)
        if self._arrivals is not None:
            cached_tokens = min(result.cached_blocks * node_block_size, prompt_tokens)
            self._arrivals.offer(ArrivalRecord(arrival_time_s or now, query.family, result.node_id,
                                               prompt_tokens, cached_tokens))
        return result

    def _candidates(self, hashes: list[int], now: float) -> list[Candidate]:
        lengths = self._index.prefix_lengths(hashes)
        return [Candidate(n.node_id, n.queued_tokens, n.waiting_requests, n.pending_requests,
                          lengths.get(n.node_id, 0), n.geometry.block_size, n.geometry.bytes_per_block)
                for n in self._cluster.live_nodes(now)]

    def _confirm(self, address: str, hashes: list[int]) -> int | None:
        if self._confirmer is None or not hashes:
            return None
        confirmed = self._confirmer.confirm(address, hashes)
        if confirmed is None and address not in self._unconfirmed:
            log.warning("kvstore %s did not answer Lookup; routing on the block index alone", address)
            self._unconfirmed.add(address)
        elif confirmed is not None and address in self._unconfirmed:
            log.info("kvstore %s answers Lookup again", address)
            self._unconfirmed.discard(address)
        return confirmed

    # --- orders ----------------------------------------------------------
    def submit_order(self, spec: OrderSpec) -> Order:
        with self._lock:
            return self._submit_locked(spec, self._clock.now())

    def report_order(self, order_id: str, state: OrderState, message: str = "",
                     bytes_sent: int = 0, blocks_sent: int = 0) -> OrderState:
        with self._lock:
            order = self._orders.report(order_id, state, self._clock.now(), message, bytes_sent, blocks_sent)
            return order.state

    def get_order(self, order_id: str) -> Order:
        with self._lock:
            return self._orders.get(order_id).snapshot()

    def watch_orders(self, node_id: str) -> Watcher:
        """A watcher of orders whose source is node_id ("" = all), primed with
        the ones still ISSUED so a reconnecting node misses nothing."""
        with self._lock:
            source = self._cluster.get(NodeId(node_id)).node_id if node_id else None
            backlog = [o.snapshot() for o in self._orders.active(source) if o.state is OrderState.ISSUED]
            return self._feed.watch(source, backlog)

    def unwatch(self, watcher: Watcher) -> None:
        self._feed.unwatch(watcher)

    def _submit_locked(self, spec: OrderSpec, now: float) -> Order:
        validate_spec(spec)
        source, target = self._cluster.get(spec.source), self._cluster.get(spec.target)
        for node in (source, target):
            if not self._cluster.is_alive(node, now):
                raise FailedPrecondition(f"node {node.node_id!r} is down; it takes no orders")
        spec = replace(spec, block_hashes=list(spec.block_hashes),
                       target_address=spec.target_address or target.address,
                       family=spec.family or default_family(spec.block_hashes),
                       policy=spec.policy or "manual")
        order = self._orders.submit(spec, now)
        self._feed.publish(order.snapshot())
        return order.snapshot()

    # --- policy and ticking ---------------------------------------------
    def set_policy(self, name: str) -> PolicyInfo:
        policy = self._registry.create(name)
        with self._lock:
            self._policy = policy
        log.info("policy is now %s", name)
        return self.get_policy()

    def get_policy(self) -> PolicyInfo:
        with self._lock:
            policy = self._policy
        return PolicyInfo(policy.name, tuple(self._registry.available()), policy.description)

    def tick(self) -> list[Order]:
        """Sweeps liveness and leases, then issues what the policy plans."""
        with self._lock:
            policy = self._policy
        policy.prepare(self._clock.now())
        issued: list[Order] = []
        with self._lock:
            now = self._clock.now()
            for node_id in self._cluster.sweep(now):
                log.warning("node %s missed heartbeats for %.1f s: down", node_id, self._cluster.node_timeout_s)
            for order in self._orders.sweep(now):
                log.info("order %s expired (%s -> %s)", order.order_id, order.spec.source, order.spec.target)
            for spec in policy.plan(now, self._view(now)):
                try:
                    issued.append(self._submit_locked(replace(spec, policy=spec.policy or policy.name), now))
                except SpeckvError as exc:
                    log.warning("policy %s planned an invalid order: %s", policy.name, exc)
        return issued

    # --- state -------------------------------------------------------------
    def cluster_state(self) -> ClusterSnapshot:
        with self._lock:
            now = self._clock.now()
            reports = tuple(NodeReport(self._node_view(n, now), max(0.0, now - n.last_heartbeat), n.routes_total)
                            for n in self._cluster.nodes())
            return ClusterSnapshot(reports, self._policy.name, self._orders.counts(),
                                   self._index.num_families(), now)

    def order_counts(self) -> dict[OrderState, int]:
        with self._lock:
            return self._orders.counts()

    def live_node_count(self) -> int:
        with self._lock:
            return len(self._cluster.live_nodes(self._clock.now()))

    def close(self) -> None:
        """Ends every WatchOrders stream."""
        self._feed.close_all()

    def _view(self, now: float) -> ClusterView:
        return ClusterView(now, tuple(self._node_view(n, now) for n in self._cluster.nodes()),
                           self._index, tuple(o.snapshot() for o in self._orders.active()))

    def _node_view(self, n: Node, now: float) -> NodeView:
        return NodeView(n.node_id, n.address, self._cluster.is_alive(n, now), n.capacity_pages,
                        n.load.free_pages, n.queued_tokens, n.load.running_tokens, n.waiting_requests,
                        n.geometry.block_size, n.geometry.bytes_per_block, self._index.num_blocks(n.node_id))


def _validate_route(hashes: list[int], prompt_tokens: int) -> None:
    if prompt_tokens <= 0:
        raise InvalidArgument(f"prompt_tokens={prompt_tokens}: must be > 0")
    if len(hashes) > prompt_tokens:
        raise InvalidArgument(f"{len(hashes)} block hashes for prompt_tokens={prompt_tokens}: "
                              "a full block holds at least one token")
    if len(set(hashes)) != len(hashes):
        raise InvalidArgument("block_hashes repeats a hash; a chained prefix never does")
    if any(not 0 <= h <= UINT64_MAX for h in hashes):
        raise InvalidArgument("block_hashes: hashes are uint64")
