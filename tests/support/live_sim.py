"""The two sides of the live-vs-simulation decision tests (imported explicitly).

Live: the real scheduler service over gRPC, its core held only to tick it
when the script says. Simulated: the objects loadgen/sim/simulation.py
wires, called directly. Both run on one manual clock; `Pair` walks a script
of steps on both and asserts after every route and tick that they decided
the same (tests/services/test_live_sim_decisions.py says what is compared).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Iterator, Sequence

import grpc

from speckv.loadgen.sim.predictor import CoreArrivals, CoreForecasts, build_predictor
from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import NotFound
from speckv.services.common.rpc.geometry_proto import geometry_from_proto
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.kvstore.events import EventType, KVEvent
from speckv.services.kvstore.servicer import event_to_proto
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server as build_predictor_server
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.event_sync import to_index_event
from speckv.services.scheduler.adapters.server import build_server, core_settings, future_arrivals
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.orders import Order, OrderState
from speckv.v1 import common_pb2, predictor_pb2, predictor_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tests.support.waiting import TIMEOUT, wait_until

POLICIES = ("none", "reactive-heat", "reactive-migrate", "predictive", "oracle")
NODES = ("n0", "n1", "n2")
BS = 16
CAPACITY = 16_384  # pages per node: room for a copy of the document
DOC = [10_000 + i for i in range(2048)]  # a shared document prefix, 32k tokens
CHAT = [20_000 + i for i in range(64)]
DOC_FAMILY, CHAT_FAMILY = str(DOC[0]), str(CHAT[0])  # as the oracle's trace keys them ("prefix")
GEOMETRY = common_pb2.KVGeometry(num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32", block_size=BS)
NO_KVSTORE = "127.0.0.1:9"  # a node whose index the script feeds directly (nothing listens there)
START = 1000.0  # the manual clock's time at script time 0

Step = tuple[float, str, tuple]


def script() -> list[Step]:
    """(time s, step, args): a document burst on n0's prefix, n0 queued for
    three seconds of it and n2, where the burst then goes, for two; some
    chat on n1; ticks every second."""
    steps: list[Step] = [(0.0, "store", ("n0", DOC, DOC_FAMILY)), (0.0, "store", ("n1", CHAT, CHAT_FAMILY))]
    for k in range(12):
        t = 0.5 + 0.25 * k
        steps.append((t, "route", (f"doc-{k}", DOC + [5000 + k], (len(DOC) + 1) * BS, DOC_FAMILY)))
        if k % 3 == 0:
            steps.append((t, "route", (f"chat-{k}", CHAT + [6000 + k], (len(CHAT) + 1) * BS, CHAT_FAMILY)))
    for second in range(1, 7):
        queued = {"n0": 3000.0 if 2 <= second <= 4 else 200.0, "n1": 100.0,
                  "n2": 3000.0 if 3 <= second <= 4 else 0.0}  # where the burst went
        for node in NODES:
            steps.append((float(second) - 0.01, "heartbeat", (node, queued[node])))
        steps.append((float(second), "tick", ()))
    return sorted(steps, key=lambda s: s[0])


def oracle_trace(path: Path, steps: Sequence[Step]) -> Path:
    """The scripted routes as a Mooncake-format trace (the oracle's future)."""
    lines = []
    for t, step, args in steps:
        if step == "route":
            _, chain, prompt, family = args
            lines.append(json.dumps({"timestamp": int(t * 1000), "input_length": prompt, "output_length": 8,
                                     "hash_ids": list(chain)}))
    path.write_text("\n".join(lines) + "\n")
    return path


class Live:
    """The scheduler service over gRPC. Its core is held (build_server's
    `inventory`) to tick it when the script says and, for nodes with no
    kvstore, to apply their KV events as the event streams would."""

    def __init__(self, config: SchedulerConfig, clock: ManualClock, stack: contextlib.ExitStack) -> None:
        held: list[SchedulerCore] = []
        server = build_server(config, build_telemetry("scheduler", {}), clock=clock, inventory=held.append).start()
        stack.callback(server.stop, 1.0)
        channel = grpc.insecure_channel(server.address)
        stack.callback(channel.close)
        self.stub = scheduler_pb2_grpc.SchedulerStub(channel)
        self.core = held[0]
        self.sequence = {n: 0 for n in NODES}

    def address(self, node: str) -> str:
        """Where node registers: its kvstore's address (NO_KVSTORE: none)."""
        return NO_KVSTORE

    def register(self, node: str, address: str = NO_KVSTORE) -> None:
        self.stub.RegisterNode(scheduler_pb2.RegisterNodeRequest(node_id=node, address=address,
                                                                 capacity_pages=CAPACITY, geometry=GEOMETRY),
                               timeout=TIMEOUT)

    def heartbeat(self, node: str, queued_ms: float) -> None:
        self.stub.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id=node, free_pages=CAPACITY,
                                                           queued_prefill_ms=queued_ms), timeout=TIMEOUT)

    def store(self, node: str, chain: list[int], family: str, event: EventType = EventType.STORED) -> None:
        self.sequence[node] += 1
        proto = event_to_proto(KVEvent(self.sequence[node], event, tuple(chain), 0.0, node, BS, family=family))
        assert self.core.apply_kv_event(NodeId(node), self.core.generation(node), to_index_event(proto))

    def route(self, request_id: str, chain: list[int], prompt: int, family: str) -> tuple[str, int]:
        r = self.stub.Route(scheduler_pb2.RouteRequest(request_id=request_id, block_hashes=chain,
                                                       prompt_tokens=prompt, family=family), timeout=TIMEOUT)
        return r.node_id, r.cached_blocks

    def report(self, order_id: str, blocks: int) -> None:
        self.stub.ReportOrderStatus(scheduler_pb2.OrderStatusReport(
            order_id=order_id, state=common_pb2.ORDER_STATE_COMMITTED, bytes_sent=blocks, blocks_sent=blocks),
            timeout=TIMEOUT)

    def nodes(self) -> dict[str, scheduler_pb2.NodeState]:
        """Each node as GetClusterState reports it."""
        state = self.stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
        return {n.node_id: n for n in state.nodes}


class Simulated:
    """A SchedulerCore wired as loadgen/sim/simulation.py wires it."""

    def __init__(self, config: SchedulerConfig, clock: ManualClock) -> None:
        predictor, _ = build_predictor("builtin", clock)
        self.core = SchedulerCore(core_settings(config), clock, get_profile(config.engine_profile),
                                  arrivals=CoreArrivals(predictor), forecasts=CoreForecasts(predictor),
                                  future=future_arrivals(config))

    def register(self, node: str, address: str = NO_KVSTORE) -> None:
        self.core.register_node(node, address, NodeSizes(CAPACITY), geometry_from_proto(GEOMETRY))

    def heartbeat(self, node: str, queued_ms: float) -> None:
        self.core.heartbeat(node, NodeLoad(free_pages=CAPACITY, queued_prefill_ms=queued_ms))

    def store(self, node: str, chain: list[int], family: str, event: EventType = EventType.STORED) -> None:
        proto = event_to_proto(KVEvent(1, event, tuple(chain), 0.0, node, BS, family=family))
        assert self.core.apply_kv_event(NodeId(node), self.core.generation(node), to_index_event(proto))

    def route(self, request_id: str, chain: list[int], prompt: int, family: str) -> tuple[str, int]:
        r = self.core.route(request_id, chain, prompt, family)
        return r.node_id, r.cached_blocks

    def report(self, order_id: str, blocks: int) -> None:
        self.core.report_order(order_id, OrderState.COMMITTED, "", blocks, blocks)


def order_key(order: Order) -> tuple:
    """What a tick decided about one order: id, action, source, target,
    blocks, tier, lease, family."""
    s = order.spec
    return (order.order_id, s.action.value, s.source, s.target, tuple(s.block_hashes), s.tier, s.lease_ms, s.family)


def order_states(core: SchedulerCore) -> dict[str, tuple]:
    """Every order the core ever issued (ids are generated in sequence,
    o-00000001 on), by id: (state, message, action, source, target, family)."""
    states: dict[str, tuple] = {}
    for k in range(1, 100_000):
        try:
            o = core.get_order(f"o-{k:08d}")
        except NotFound:
            return states
        states[o.order_id] = (o.state.name, o.message, o.spec.action.value, o.spec.source, o.spec.target,
                              o.spec.family)
    return states


@dataclasses.dataclass
class Pair:
    """One policy, live and simulated, on one manual clock; `step` runs a
    scripted step on both and asserts they decided the same."""

    policy: str
    clock: ManualClock
    live: Live
    sim: Simulated
    predictor: predictor_pb2_grpc.PredictorStub
    routes: int = 0
    decisions: int = 0

    def at(self, t: float) -> None:
        self.clock.advance(START + t - self.clock.now())

    def route(self, t: float, args: tuple) -> tuple[str, int]:
        """Routes on both; the node and cached prefix must match."""
        live, sim = self.live.route(*args), self.sim.route(*args)
        assert live == sim, (self.policy, t, args[0], "live", live, "simulated", sim)
        self.routes += 1
        return live

    def tick(self, t: float, unreported: Sequence[str] = ()) -> list[Order]:
        """Ticks both; the orders must match. Each lands as an agent would
        report it, except those naming a node in `unreported` (its agent
        has not got to them): they stay ISSUED."""
        if self.policy == "predictive":  # the live predictor sees arrivals off the request path
            assert wait_until(lambda: self.predictor.GetModelInfo(predictor_pb2.ModelInfoRequest(),
                                                                  timeout=TIMEOUT).observations_total == self.routes)
        live_orders, sim_orders = self.live.core.tick(), self.sim.core.tick()
        assert [order_key(o) for o in live_orders] == [order_key(o) for o in sim_orders], (self.policy, t)
        for order in live_orders:
            if order.spec.source in unreported or order.spec.target in unreported:
                continue
            self.live.report(order.order_id, len(order.spec.block_hashes))
            self.sim.report(order.order_id, len(order.spec.block_hashes))
        self.decisions += len(live_orders)
        return live_orders

    def step(self, t: float, step: str, args: tuple) -> None:
        """One scripted step (route, tick, store, heartbeat, register) at script time t."""
        self.at(t)
        if step == "route":
            self.route(t, args)
        elif step == "tick":
            self.tick(t, *args)
        else:
            getattr(self.live, step)(*args)
            getattr(self.sim, step)(*args)


@contextlib.contextmanager
def live_and_simulated(policy: str, clock: ManualClock, steps: Sequence[Step], tmp_path: Path,
                       live_type: type[Live] = Live) -> Iterator[Pair]:
    """A predictor service, the live scheduler (live_type) and its simulated
    twin with NODES registered on both; the oracle's future is the routes
    of `steps`."""
    with contextlib.ExitStack() as stack:
        predictor = build_predictor_server(PredictorConfig(), build_telemetry("predictor", {}), clock=clock).start()
        stack.callback(predictor.stop, 1.0)
        pred_channel = grpc.insecure_channel(predictor.address)
        stack.callback(pred_channel.close)
        config = SchedulerConfig(engine_profile="llama-3-8b-h100", tick_s=3600.0, policy=policy, confirm_routes=False,
                                 predictor=predictor.address if policy == "predictive" else "",
                                 oracle_trace=str(oracle_trace(tmp_path / "future.jsonl", steps)),
                                 oracle_family="prefix", oracle_offset_s=START, node_timeout_s=30.0)
        live = live_type(config, clock, stack)
        sim = Simulated(dataclasses.replace(config, predictor=""), clock)
        for node in NODES:
            live.register(node, live.address(node))
            sim.register(node, live.address(node))
        yield Pair(policy, clock, live, sim, predictor_pb2_grpc.PredictorStub(pred_channel))
