"""SchedulerCore: the facade the servicer calls. Pure Python, thread-safe.

One lock guards the cluster, the block index, the orders and the router, so
every RPC sees a consistent picture; nothing blocking runs under it. What it
is built with (settings, the remote consultations, the durable journal) is
in ports.py.

Routing scores the candidates CandidateSelector picks (routing/candidates.py:
the live holders of the first block plus the `router.spread_candidates`
least-queued other live nodes); route records live in routing/route_records.py,
and the half of a route that runs outside the lock (confirming the prefix,
reporting the arrival) in routing/confirmation.py. Each routed
request feeds the family catalog (chain, prompt length, heat) and marks a
replica of its family on the chosen node as used: the route's
RouteObservation (routing/observation.py), which a peer replica applies
through observe_routes as if it had routed the request. Order transitions go
through OrderLifecycle (retries, replicas, commits seen in KV events); the
order RPCs are OrderDesk's (replication/order_desk.py), a mixin of this class.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Sequence

from speckv.services.common.clock import Clock
from speckv.services.common.engine_profile import EngineProfile, LinkModel
from speckv.services.common.errors import InvalidArgument, SpeckvError, Unavailable
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.cluster import Cluster, LoadReport, Node, NodeLoad, NodeStatus
from speckv.services.scheduler.families import FamilyCatalog
from speckv.services.scheduler.forecasts import ForecastSource, FutureArrivals
from speckv.services.scheduler.holder_index import HolderEventKind, HolderIndex, IndexEvent
from speckv.services.scheduler.policies.base import Policy
from speckv.services.scheduler.policies.context import PolicyContext
from speckv.services.scheduler.policies.registry import PolicyRegistry, default_registry
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.ports import (
    ArrivalSink,
    NodeListener,
    PrefixConfirmer,
    SavedNode,
    SavedState,
    SchedulerSettings,
    StateJournal,
)
from speckv.services.scheduler.restore import adopt_state, restore_nodes_and_orders, saved_policy
from speckv.services.scheduler.replication.lifecycle import OrderLifecycle
from speckv.services.scheduler.replication.order_desk import OrderDesk
from speckv.services.scheduler.replication.order_feed import OrderFeed
from speckv.services.scheduler.orders import ActionKind, Order, OrderState, OrderTracker
from speckv.services.scheduler.replication.outcomes import ActionStats
from speckv.services.scheduler.replication.replicas import LeasedReplicas
from speckv.services.scheduler.reuse_history import ReuseHistory
from speckv.services.scheduler.routing.candidates import CandidateSelector
from speckv.services.scheduler.routing.confirmation import RouteConfirmation
from speckv.services.scheduler.routing.join_ramp import JoinRamp
from speckv.services.scheduler.routing.disk_backlog import DiskBacklog
from speckv.services.scheduler.routing.link_backlog import LinkBacklog
from speckv.services.scheduler.routing.observation import RouteObservation, RouteObserver
from speckv.services.scheduler.routing.preference import decide
from speckv.services.scheduler.routing.route_records import PickedRoute, RouteRequestItem, RouteResult, route_query
from speckv.services.scheduler.routing.router import KvAwareRouter, RouteQuery, uncached_tokens
from speckv.services.scheduler.snapshot import ClusterSnapshot, NodeReport, PolicyInfo
from speckv.services.scheduler.view_builder import cluster_view, node_view
from speckv.services.scheduler.views import ClusterView, NodeView, Plan

log = logging.getLogger(__name__)


class SchedulerCore(OrderDesk):
    def __init__(self, settings: SchedulerSettings, clock: Clock, profile: EngineProfile,
                 registry: PolicyRegistry | None = None, confirmer: PrefixConfirmer | None = None,
                 arrivals: ArrivalSink | None = None, listener: NodeListener | None = None,
                 forecasts: ForecastSource | None = None, future: FutureArrivals | None = None,
                 state: StateJournal | None = None) -> None:
        self.settings = settings
        self._clock = clock
        self._profile = profile
        self._pcfg = settings.policy_config or load_policy_config()
        link = LinkModel(settings.link_gbps, settings.link_overhead_ms)
        self._link_bytes_per_s = settings.link_gbps * 1e9 / 8
        host_link = (LinkModel(settings.host_link_gbps, settings.host_link_overhead_ms)
                     if settings.host_link_gbps > 0 else None)
        disk = LinkModel(settings.disk_gbps, settings.disk_overhead_ms) if settings.disk_gbps > 0 else None
        self.context = PolicyContext(self._pcfg, profile, link, host_link=host_link, forecasts=forecasts,
                                     future=future, disk=disk)
        self._registry = registry or default_registry(self.context)
        self._policy: Policy = self._registry.create(settings.policy)
        self._listener = listener
        self._cluster = Cluster(settings.node_timeout_s, profile.queue_ms, self._pcfg.router.pending_stale_s)
        self._index = HolderIndex()
        self._families = FamilyCatalog(self._pcfg.families)
        self._state = state
        self._orders = OrderTracker(journal=state)
        self._lifecycle = OrderLifecycle(self._orders, LeasedReplicas(), self._index, self._submit_locked,
                                         self._alive, self._bytes_per_block, self._pcfg.leases.max_retries)
        self._lifecycle.transports.journal = state  # the copies by transport survive a restart with the orders
        self._feed = OrderFeed(settings.watch_queue)
        self._reuse = ReuseHistory(self._pcfg.reuse)
        self._router = KvAwareRouter(profile, link, settings.router_seed, settings.tie_ms, host_link, disk,
                                     self._pcfg.router.prefill_ahead_weight,
                                     self._pcfg.router.prefill_ahead_budget_tokens)
        self._confirmation = RouteConfirmation(self._router, confirmer, arrivals)
        self._backlog, self._disks = LinkBacklog(link), DiskBacklog(disk)
        self._ramp = JoinRamp(self._pcfg.router.join_ramp_s)
        self._selector = CandidateSelector(self._cluster, self._index, self._backlog,
                                           self._pcfg.router.spread_candidates, self._ramp, self._disks)
        self._observer = RouteObserver(self._cluster, self._backlog, self._reuse, self._index, self._families,
                                       self._lifecycle, self._disks)
        self._lock = threading.Lock()

    # --- nodes -----------------------------------------------------------
    def register_node(self, node_id: str, address: str, sizes: NodeSizes,
                      geometry: KVGeometry | None) -> tuple[bool, int]:
        """sizes: its tiers and retention cap (Cluster.register checks them).
        Returns (re_registered, heartbeat_interval_ms)."""
        with self._lock:
            old = self._cluster.find(NodeId(node_id))
            old_address = old.address if old else None
            node, again = self._cluster.register(NodeId(node_id), address, sizes,
                                                 geometry or self._profile.geometry, self._clock.now())
            self._index.drop_node(node.node_id)
            self._lifecycle.ledger.drop_node(node.node_id)
            self._backlog.forget(node.node_id)
            self._disks.forget(node.node_id)
            self._reuse.forget(node.node_id)
            now = self._clock.now()
            self._ramp.joined(node.node_id, now, self._cluster.routes_total, node.routes_total,
                              len(self._cluster.live_nodes(now)))
            generation = node.generation
            if self._state is not None:
                # A failed write fails this call with the registration made in memory;
                # the node's agent registers again, which saves it and restarts its stream.
                self._state.node_registered(SavedNode(node.node_id, node.address, node.sizes, node.geometry))
        log.info("node %s %sregistered at %s", node_id, "re-" if again else "", address)
        if self._listener is not None:
            self._listener.node_registered(NodeId(node_id), address, generation, old_address)
        return again, self.settings.heartbeat_interval_ms

    def generation(self, node_id: str) -> int:
        """The current registration's generation (what KV event feeders pass)."""
        with self._lock:
            return self._cluster.get(NodeId(node_id)).generation

    def heartbeat(self, node_id: str, load: NodeLoad | LoadReport) -> bool:
        """Merges a load report (see Cluster.heartbeat); False for an unknown node."""
        with self._lock:
            node = self._cluster.find(NodeId(node_id))
            was_down = node is not None and not self._cluster.is_alive(node, self._clock.now())
            known = self._cluster.heartbeat(NodeId(node_id), load, self._clock.now())
        if was_down:
            log.info("node %s is back", node_id)
        return known

    def apply_kv_event(self, node_id: NodeId, generation: int, event: IndexEvent) -> bool:
        """Applies one KV event; False when generation is stale (node
        re-registered) or the node is down (it must register again)."""
        with self._lock:
            node = self._cluster.find(node_id)
            if node is None or node.generation != generation or node.status is NodeStatus.DOWN:
                return False
            self._apply_locked(node_id, event, self._clock.now())
            return True

    def apply_kv_events(self, node_id: NodeId, generation: int, events: Sequence[IndexEvent]) -> bool:
        """Applies events in order under one lock (what one kvstore call
        changed); False when generation is stale or the node is down."""
        with self._lock:
            node = self._cluster.find(node_id)
            if node is None or node.generation != generation or node.status is NodeStatus.DOWN:
                return False
            now = self._clock.now()
            for event in events:
                self._apply_locked(node_id, event, now)
            return True

    def _apply_locked(self, node_id: NodeId, event: IndexEvent, now: float) -> None:
        self._index.apply(node_id, event)
        if event.kind is HolderEventKind.COMMITTED:
            self._lifecycle.kv_committed(node_id, now)
        elif event.kind is HolderEventKind.REMOVED:
            self._reuse.removed(node_id, event.tier, event.block_hashes, now)

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
        query = route_query(request_id, block_hashes, prompt_tokens, family, arrival_time_s)
        with self._lock:
            now = self._clock.now()
            picked = self._route_locked(query, now, min(arrival_time_s, now) if arrival_time_s else now)
        return self._confirmation.finish(query, picked, arrival_time_s or now)

    def route_batch(self, requests: Sequence[RouteRequestItem]) -> list[RouteResult]:
        """Routes many requests under one lock acquisition, in order. A
        malformed item fails the whole batch, naming its index."""
        queries = []
        for i, r in enumerate(requests):
            try:
                queries.append(route_query(r.request_id, r.block_hashes, r.prompt_tokens, r.family, r.arrival_time_s))
            except InvalidArgument as exc:
                raise InvalidArgument(f"requests[{i}]: {exc}") from None
        with self._lock:
            now = self._clock.now()
            picked = []
            for i, query in enumerate(queries):
                try:
                    at = min(requests[i].arrival_time_s, now) if requests[i].arrival_time_s else now
                    picked.append(self._route_locked(query, now, at))
                except InvalidArgument as exc:
                    raise InvalidArgument(f"requests[{i}]: {exc}") from None
        return [self._confirmation.finish(q, p, r.arrival_time_s or now)
                for q, p, r in zip(queries, picked, requests)]

    def observe_routes(self, observations: Sequence[RouteObservation]) -> None:
        """Applies routes decided elsewhere (a peer replica's, from their
        RouteResult.observation) to this core's planner state, as if it had
        routed them: routing/observation.py. Decides nothing; an observation
        of a node this core does not know is skipped."""
        with self._lock:
            now = self._clock.now()
            for observation in observations:
                self._observe_routed_locked(observation, now)

    def _route_locked(self, query: RouteQuery, now: float, arrival_s: float) -> PickedRoute:
        """arrival_s (<= now): when the request came; a pull it is routed to
        is booked on the links from then, so the warm start's history,
        routed long after it arrived, does not hold today's links."""
        hashes = query.block_hashes
        block_size = self._cluster.block_size()
        if block_size and len(hashes) * block_size > query.prompt_tokens:
            raise InvalidArgument(f"{len(hashes)} block hashes of {block_size} tokens exceed "
                                  f"prompt_tokens={query.prompt_tokens}")
        candidates = self._selector.candidates(hashes, now)
        if not candidates:
            raise Unavailable("no live node to route to")
        # The policy's routing hook (routing/preference.py), on the arrival clock; without one, the router's choice.
        decision, candidates = decide(self._policy, self._router, self._selector, query, candidates, now, arrival_s,
                                      lambda: len(self._cluster.live_nodes(now)))
        node = self._cluster.get(decision.node_id)
        observation = RouteObservation.of(query, decision, candidates,
                                          uncached_tokens(decision, query, node.geometry.block_size), arrival_s)
        self._observe_routed_locked(observation, now)
        return PickedRoute(decision, candidates, node.address, node.geometry.block_size, observation)

    def _observe_routed_locked(self, observation: RouteObservation, now: float) -> bool:
        return self._observer.apply(observation, now)

    # --- policy and ticking ---------------------------------------------
    def set_policy(self, name: str) -> PolicyInfo:
        policy = self._registry.create(name)
        with self._lock:
            if self._state is not None:
                self._state.policy_set(name)  # first: a failed write keeps the old policy
            self._policy = policy
        log.info("policy is now %s", name)
        return self.get_policy()

    def get_policy(self) -> PolicyInfo:
        with self._lock:
            policy = self._policy
        return PolicyInfo(policy.name, tuple(self._registry.available()), policy.description)

    def tick(self, plan: bool = True) -> list[Order]:
        """Sweeps liveness, orders and replica leases, then applies what the
        policy plans: cancellations first, then new orders. A policy with
        `needs_view = False` (its plan reads no view, e.g. `none`) gets None,
        sparing the O(nodes + active orders) view every tick. plan=False:
        sweeps only (a scheduler replica that does not lead)."""
        if not plan:
            with self._lock:
                self._sweep_locked(self._clock.now())
            return []
        with self._lock:
            policy = self._policy
        policy.prepare(self._clock.now())
        issued: list[Order] = []
        with self._lock:
            now = self._clock.now()
            self._sweep_locked(now)
            if self._policy is not policy:
                return []  # SetPolicy raced with prepare(); the next tick plans with the new one
            planned = policy.plan(now, self._view(now) if getattr(policy, "needs_view", True) else None)
            planned = planned if isinstance(planned, Plan) else Plan(list(planned))
            for order_id in planned.cancel:
                try:
                    self._cancel_locked(order_id, now, f"{policy.name}: burst no longer forecast")
                except SpeckvError as exc:
                    log.debug("policy %s could not cancel %s: %s", policy.name, order_id, exc)
            for spec in planned.orders:
                try:
                    issued.append(self._submit_locked(replace(spec, policy=spec.policy or policy.name), now))
                except SpeckvError as exc:
                    log.warning("policy %s planned an invalid order: %s", policy.name, exc)
        return issued

    def node_lost(self, node_id: str, reason: str, generation: int | None = None) -> bool:
        """Declares a node down now, without waiting for its heartbeat timeout
        (its kvstore's event stream closed, a write to it failed, an operator
        removed it): see _forget_locked. With generation, only that
        registration (a node already registered again is a new incarnation,
        and the loss was its predecessor's). False when unknown, already down
        or of another generation."""
        with self._lock:
            node = self._cluster.find(NodeId(node_id))
            if node is None or (generation is not None and node.generation != generation):
                return False
            if not self._cluster.mark_down(NodeId(node_id)):
                return False
            log.warning("node %s lost (%s): down", node_id, reason)
            self._forget_locked(NodeId(node_id), self._clock.now())
        return True

    def _forget_locked(self, node_id: NodeId, now: float) -> None:
        """What a node going down costs it: its holdings leave the index (a
        node that comes back registers again and rebuilds them from its event
        stream), its replicas and reuse history are dropped, and its orders
        fail, which frees their bookings here; a survivor's reservation for a
        failed transfer is freed by that survivor when the data connection
        closes or the reservation's lease ends (docs/limits.md)."""
        self._index.drop_node(node_id)
        self._lifecycle.ledger.drop_node(node_id)
        self._backlog.forget(node_id)
        self._disks.forget(node_id)
        self._reuse.forget(node_id)
        self._ramp.forget(node_id)
        self._lifecycle.node_down(node_id, now)

    def _sweep_locked(self, now: float) -> None:
        self._backlog.prune(now)
        self._disks.prune(now)
        for node_id in self._cluster.sweep(now):
            log.warning("node %s missed heartbeats for %.1f s: down", node_id, self._cluster.node_timeout_s)
            self._forget_locked(node_id, now)
        expired, released = self._lifecycle.sweep(now)
        for order in expired:
            log.info("order %s expired (%s -> %s)", order.order_id, order.spec.source, order.spec.target)
        for replica in released:
            log.debug("replica of %s on %s released unused", replica.family, replica.node)

    # --- durable state ---------------------------------------------------
    def restore(self, saved: SavedState) -> None:
        """Resumes from what a previous run saved (restore.py says what comes
        back and what does not); once, on a core with no nodes and no orders,
        before serving (the server calls it after wiring the listener)."""
        policy = saved_policy(saved, self._policy, self._registry)
        with self._lock:
            registered = restore_nodes_and_orders(saved, self._cluster, self._orders, self._lifecycle,
                                                  self._clock.now())
            if policy is not None:
                self._policy = policy
        if policy is not None:
            log.info("policy %s restored from the saved state", policy.name)
        log.info("restored %d nodes (alive at their next heartbeat) and %d orders", len(registered),
                 len(saved.orders))
        if self._listener is not None:
            for node_id, address, generation in registered:
                self._listener.node_registered(node_id, address, generation, None)

    def take_over(self, saved: SavedState) -> None:
        """This scheduler replica now leads: it adopts the shared state's
        orders and policy (restore.py's adopt_state) on its live core."""
        policy = saved_policy(saved, self._policy, self._registry)
        with self._lock:
            registered = adopt_state(saved, self._cluster, self._orders, self._lifecycle, self._clock.now())
            if policy is not None:
                self._policy = policy
        log.info("leading: adopted %d orders%s", len(saved.orders),
                 f" and policy {policy.name}" if policy is not None else "")
        if self._listener is not None:
            for node_id, address, generation in registered:
                self._listener.node_registered(node_id, address, generation, None)

    def step_down(self) -> None:
        """This replica no longer leads: it forgets its orders (the leader has
        them from the shared state, where this one journaled them)."""
        with self._lock:
            self._orders.clear()
            self._lifecycle.transports.restore(())  # the leader's figures come back with the state it adopts

    # --- state -------------------------------------------------------------
    def cluster_state(self) -> ClusterSnapshot:
        with self._lock:
            now = self._clock.now()
            reports = tuple(NodeReport(self._node_view(n, now), max(0.0, now - n.last_heartbeat), n.routes_total)
                            for n in self._cluster.nodes())
            stats = self._lifecycle.ledger.stats
            return ClusterSnapshot(reports, self._policy.name, self._orders.counts(), self._index.num_families(), now,
                                   replace(stats), self._lifecycle.retries_issued,
                                   tuple(self._lifecycle.transports.rows()))

    def order_counts(self) -> dict[OrderState, int]:
        with self._lock:
            return self._orders.counts()

    def action_outcomes(self) -> dict[tuple[str, ActionKind], ActionStats]:
        """Per (policy, action kind): orders, bytes and what they came to
        (outcomes.py); a copy, so a caller may read it outside the lock."""
        with self._lock:
            self._lifecycle.outcomes.sweep(self._clock.now())
            return {key: stats.copy() for key, stats in self._lifecycle.outcomes.stats().items()}

    def live_node_count(self) -> int:
        with self._lock:
            return len(self._cluster.live_nodes(self._clock.now()))

    def close(self) -> None:
        """Ends every WatchOrders stream."""
        self._feed.close_all()

    def _view(self, now: float) -> ClusterView:
        return cluster_view(now, self._cluster, self._index, self._orders, self._families, self._lifecycle.ledger,
                            self._link_bytes_per_s, self._backlog, self._reuse, self._ramp, self._disks)

    def _node_view(self, n: Node, now: float) -> NodeView:
        return node_view(self._cluster, self._index, n, now)
