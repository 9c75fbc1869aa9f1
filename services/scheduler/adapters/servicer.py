"""Scheduler gRPC servicer: unpack, check the caller's identity where a call
is guarded (authz.py; off without TLS), check the wire limits (RequestLimits),
call SchedulerCore, pack. Errors are the core's domain errors, mapped to
status codes by the shared interceptor."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterator

from speckv.services.common.rpc import authz
from speckv.services.common.errors import Aborted, InvalidArgument, PermissionDenied
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.rpc.geometry_proto import geometry_from_proto
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.adapters.outcomes_proto import actions_to_proto
from speckv.services.scheduler.adapters.observation_proto import observation_from_proto
from speckv.services.scheduler.adapters.replica_role import ReplicaRole
from speckv.services.scheduler.cluster import LoadReport
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.orders import ActionKind, Order, OrderSpec, OrderState
from speckv.services.scheduler.routing.observation import RouteObservation
from speckv.services.scheduler.routing.route_records import RouteRequestItem, RouteResult
from speckv.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

STATE_TO_PROTO = {s: common_pb2.OrderState.Value(f"ORDER_STATE_{s.name}") for s in OrderState}
STATE_FROM_PROTO = {v: k for k, v in STATE_TO_PROTO.items()}
# HeartbeatRequest's optional load fields, in LoadReport's order.
_LOAD_FIELDS = ("queued_tokens", "running_tokens", "free_pages", "num_running_requests", "num_waiting_requests",
                "queued_prefill_ms", "retained_blocks")
WATCH_POLL_S = 1.0  # how often an idle WatchOrders stream checks that its client is still there


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may carry (SchedulerConfig's fields of the same
    names): prompt tokens, and characters of a family name. The router books
    a routed prompt's tokens on its node until that node's next heartbeat,
    and the family catalog keeps every name, so neither may be unbounded."""

    max_prompt_tokens: int = 262_144
    max_family_chars: int = 256

    def check_family(self, family: str, what: str = "family") -> None:
        if len(family) > self.max_family_chars:
            raise InvalidArgument(f"{what} is {len(family)} characters long, at most {self.max_family_chars} "
                                  "(max_family_chars)")

    def check_route(self, prompt_tokens: int, family: str) -> None:
        if prompt_tokens > self.max_prompt_tokens:
            raise InvalidArgument(f"prompt_tokens={prompt_tokens}: more than the model's context, "
                                  f"max_prompt_tokens={self.max_prompt_tokens}")
        self.check_family(family)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, core: SchedulerCore, stopping: threading.Event,
                 limits: RequestLimits = RequestLimits(),
                 on_failed_order: Callable[[NodeId, str], None] | None = None,
                 role: ReplicaRole | None = None,
                 on_routed: Callable[[list[RouteObservation]], None] | None = None) -> None:
        """on_failed_order(target, why): told of every order reported FAILED
        (the server has the scheduler check the target itself: a source's
        word alone never declares another node down). role: this process as
        a replica (replica_role.py); None: the one scheduler, which leads.
        on_routed: told what each Route here applied (a replica shares it
        with its peers: route_sharing.py); it must not block."""
        self._core = core
        self._on_routed = on_routed
        self._role = role or ReplicaRole()
        self._stopping = stopping
        self._limits = limits
        self._on_failed_order = on_failed_order

    def RegisterNode(self, request, context):
        authz.require_node(context, request.node_id, "RegisterNode")
        sizes = NodeSizes(request.capacity_pages, request.host_pages,
                          request.retain_max_blocks if request.HasField("retain_max_blocks") else None)
        again, interval_ms = self._core.register_node(request.node_id, request.address, sizes, _geometry(request))
        return scheduler_pb2.RegisterNodeResponse(
            node_id=request.node_id, heartbeat_interval_ms=interval_ms, re_registered=again,
            leadership=self._role.leadership_proto())

    def Heartbeat(self, request, context):
        authz.require_node(context, request.node_id, "Heartbeat")
        load = LoadReport(*(getattr(request, name) if request.HasField(name) else None for name in _LOAD_FIELDS))
        return scheduler_pb2.HeartbeatResponse(known=self._core.heartbeat(request.node_id, load),
                                               leadership=self._role.leadership_proto())

    def Route(self, request, context):
        self._limits.check_route(request.prompt_tokens, request.family)
        result = self._core.route(request.request_id, request.block_hashes, request.prompt_tokens,
                                  request.family, request.arrival_time_s)
        if self._on_routed is not None and result.observation is not None:
            self._on_routed([result.observation])
        return _route_response(result)

    def RouteBatch(self, request, context):
        for i, r in enumerate(request.requests):
            try:
                self._limits.check_route(r.prompt_tokens, r.family)
            except InvalidArgument as exc:
                raise InvalidArgument(f"requests[{i}]: {exc}") from None
        items = [RouteRequestItem(r.request_id, r.block_hashes, r.prompt_tokens, r.family, r.arrival_time_s)
                 for r in request.requests]
        results = self._core.route_batch(items)
        if self._on_routed is not None:
            self._on_routed([r.observation for r in results if r.observation is not None])
        return scheduler_pb2.RouteBatchResponse(responses=[_route_response(r) for r in results])

    def ShareRoutes(self, request, context):
        authz.require_service_or_admin(context, "scheduler", "ShareRoutes")
        observations = []
        for i, m in enumerate(request.routes):
            try:
                self._limits.check_route(m.prompt_tokens, m.family)
            except InvalidArgument as exc:
                raise InvalidArgument(f"routes[{i}]: {exc}") from None
            observations.append(observation_from_proto(m, f"routes[{i}]"))
        self._core.observe_routes(observations)
        return scheduler_pb2.ShareRoutesAck(applied=len(observations))

    def WatchOrders(self, request, context) -> Iterator[common_pb2.ReplicationOrder]:
        authz.require_node_or_admin(context, request.node_id, "WatchOrders")  # node_id "": every node's, admin only
        watcher = self._core.watch_orders(request.node_id)
        context.add_callback(watcher.close)  # client gone: wake the loop at once
        try:
            while not self._stopping.is_set():
                order = watcher.next(WATCH_POLL_S)
                # A replica that does not lead sends nothing (a deposed leader's last orders included).
                if order is not None and self._role.is_leader():
                    yield order_to_proto(order, self._role.epoch())
                elif watcher.closed or not context.is_active():
                    break
            if watcher.overflowed:
                raise Aborted("this WatchOrders reader fell behind; reconnect to get the issued orders")
        finally:
            self._core.unwatch(watcher)

    def SubmitOrder(self, request, context):
        authz.require_admin(context, "SubmitOrder")
        self._role.require_leader("SubmitOrder")
        if not request.HasField("order"):
            raise InvalidArgument("order is missing")
        o = request.order
        self._limits.check_family(o.family, "order.family")
        if o.target_address and authz.enforced(context):
            # Over TLS an order goes only where its target registered (issue 23: no order to an arbitrary host:port).
            registered = {r.view.node_id: r.view.address for r in self._core.cluster_state().nodes}
            if registered.get(o.target_node) != o.target_address:
                raise PermissionDenied(f"SubmitOrder: target_address={o.target_address!r} is not the registered "
                                       f"address of node {o.target_node!r}; leave it empty to use that")
        spec = OrderSpec(Family(o.family), list(o.block_hashes), NodeId(o.source_node), NodeId(o.target_node),
                         o.lease_ms, o.priority, o.expected_benefit_ms, o.policy, o.target_address, o.order_id,
                         Tier.parse(o.target_medium) if o.target_medium else None,
                         ActionKind.parse(o.action))
        return scheduler_pb2.SubmitOrderResponse(order_id=self._core.submit_order(spec).order_id)

    def ReportOrderStatus(self, request, context):
        state = STATE_FROM_PROTO.get(request.state)
        if state is None:
            raise InvalidArgument(f"state={request.state}: report IN_FLIGHT, COMMITTED, FAILED, "
                                  "CANCELLED or EXPIRED")
        self._role.require_leader("ReportOrderStatus")
        if authz.enforced(context):  # the order's source node runs it and reports it; else an admin
            authz.require_node_or_admin(context, self._core.get_order(request.order_id).spec.source,
                                        "ReportOrderStatus")
        new_state = self._core.report_order(request.order_id, state, request.message,
                                            request.bytes_sent, request.blocks_sent, request.transport)
        if new_state is OrderState.FAILED and state is OrderState.FAILED and self._on_failed_order is not None:
            target = self._core.get_order(request.order_id).spec.target
            self._on_failed_order(target, f"order {request.order_id} to it failed ({request.message[:200]})")
        return scheduler_pb2.OrderStatusAck(state=STATE_TO_PROTO[new_state])

    def SetPolicy(self, request, context):
        authz.require_admin(context, "SetPolicy")
        self._role.require_leader("SetPolicy")
        return _policy_info(self._core.set_policy(request.name))

    def GetPolicy(self, request, context):
        return _policy_info(self._core.get_policy())

    def GetClusterState(self, request, context):
        snap = self._core.cluster_state()
        nodes = [scheduler_pb2.NodeState(
            node_id=r.view.node_id, address=r.view.address, alive=r.view.alive,
            capacity_pages=r.view.sizes.device_pages, free_pages=r.view.free_pages,
            queued_tokens=r.view.queued_tokens, running_tokens=r.view.running_tokens,
            num_blocks=r.view.num_blocks, last_heartbeat_age_s=r.last_heartbeat_age_s,
            routes_total=r.routes_total, host_pages=r.view.sizes.host_pages, host_blocks=r.view.host_blocks,
            retain_max_blocks=r.view.sizes.retain_max_blocks, retained_blocks=r.view.retained_blocks)
            for r in snap.nodes]
        orders = [scheduler_pb2.OrderCount(state=STATE_TO_PROTO[s], count=c) for s, c in snap.order_counts.items()]
        r = snap.replicas
        return scheduler_pb2.ClusterState(
            nodes=nodes, policy=snap.policy, orders=orders, num_families=snap.num_families, now_s=snap.now,
            replicas_committed=r.committed, replicas_kept=r.kept, replicas_released_unused=r.released_unused,
            bytes_replicated=r.bytes_committed, bytes_wasted=r.bytes_wasted, order_retries=snap.retries,
            actions=actions_to_proto(self._core.action_outcomes()),
            transports=[scheduler_pb2.TransportStats(source_node=c.source, target_node=c.target,
                                                     transport=c.transport, orders=c.orders, bytes=c.bytes)
                        for c in snap.transports],
            leadership=self._role.leadership_proto())


def _route_response(r: RouteResult) -> scheduler_pb2.RouteResponse:
    return scheduler_pb2.RouteResponse(
        node_id=r.node_id, address=r.address, cached_blocks=r.cached_blocks,
        expected_ttft_ms=r.expected_ttft_ms, fetch_from_node=r.fetch_from or "",
        fetch_blocks=r.fetch_blocks, family=r.family, queue_ms=r.queue_ms,
        prefill_ms=r.prefill_ms, fetch_ms=r.fetch_ms, promote_blocks=r.promote_blocks, promote_ms=r.promote_ms,
        disk_blocks=r.disk_blocks)


def order_to_proto(order: Order, epoch: int = 0) -> common_pb2.ReplicationOrder:
    """epoch: the sending leader's fencing token (0: no election)."""
    s = order.spec
    return common_pb2.ReplicationOrder(
        order_id=order.order_id, family=s.family, block_hashes=s.block_hashes, source_node=s.source,
        target_node=s.target, target_address=s.target_address, lease_ms=s.lease_ms, priority=s.priority,
        expected_benefit_ms=s.expected_benefit_ms, policy=s.policy,
        cancelled=order.state is OrderState.CANCELLED, target_medium=s.tier.medium if s.tier else "",
        action=s.action.value, epoch=epoch)


def _geometry(request: scheduler_pb2.RegisterNodeRequest) -> KVGeometry | None:
    """The node's geometry, or None (the engine profile's) when it sent none."""
    g = request.geometry
    if not request.HasField("geometry") or not (g.num_layers or g.num_kv_heads or g.head_dim or g.block_size or g.dtype):
        return None
    return geometry_from_proto(g)


def _policy_info(info) -> scheduler_pb2.PolicyInfo:
    return scheduler_pb2.PolicyInfo(name=info.name, available=list(info.available), description=info.description)
