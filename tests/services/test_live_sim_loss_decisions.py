"""Every policy makes the same decisions live and in simulation through a
scripted node loss and the node's return (issue 27: "the simulator and the
live cluster make the same decisions on a scripted loss").

The scenario of tests/services/test_live_sim_decisions.py, with n1 a real
kvstore server (its chat prefix stored there, reaching the live index over
its KV event stream) and idle (its heartbeats report no queue), so its chat
prefix draws the chat routes; then, in the middle of the document burst:
- t=2.0: the tick's orders naming n1 are not reported (its agent has not got
  to them), and at 2.05 an operator orders n1's chat prefix to n2 and a
  document prefix from n0 to n1: n1 has orders in flight both ways.
- t=2.1: n1 is lost. Live, its kvstore server stops, and the scheduler
  learns it the way it learns a killed kvstore process (test_node_loss.py):
  its event stream from n1 closes, the immediate reconnect is refused, and
  the loss rule build_server wires (server._LossRule) calls
  SchedulerCore.node_lost for that registration. The log says so, and
  nothing else could have: the heartbeat timeout is 30 s and the clock
  stands still while the test waits.
  Simulated, as loadgen/sim/simulation.py's _kill declares it:
  SchedulerCore.node_lost(node, reason) at once. n1 heartbeats no more.
- Routes for n1's chat family and for the document, and a tick, while n1 is
  down.
- t=3.1: n1 comes back, a new kvstore at a new address registering again
  (a new incarnation, a new generation), its event stream followed anew;
  the script routes both families again and ticks to the end.

Compared after every step, as in the scenario without loss: each route's
node and cached prefix, each tick's orders. Also: no route names n1 between
its loss and its return; every order's state and message by order id after
the loss and after each tick (those naming n1 FAILED on both sides for the
same reason); after its return n1 holds nothing in either index and its
generation moved on on both sides.

The live core is held (build_server's `inventory`) only to tick it when the
script says; that mode starts no event streams, so the test starts n1's the
way build_server does (EventSync with the core's apply/reset and _LossRule)
and follows n1 again on its re-registration as the server's _NodeWiring
does. The other nodes' KV events are applied as in the scenario without loss.
"""
from __future__ import annotations

import contextlib

import grpc
import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.rpc.geometry_proto import geometry_from_proto
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.rpc.server import ServiceServer
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.kvstore.events import EventType
from speckv.services.kvstore.server import build_server as build_kvstore_server
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.event_sync import EventSync
from speckv.services.scheduler.adapters.server import _LossRule
from speckv.services.scheduler.orders import OrderSpec
from speckv.v1 import common_pb2, kvstore_pb2_grpc, scheduler_pb2
from tests.support.kvstore_service import put
from tests.support.live_sim import (
    BS,
    CHAT,
    CHAT_FAMILY,
    DOC,
    DOC_FAMILY,
    GEOMETRY,
    POLICIES,
    START,
    Live,
    Pair,
    Step,
    live_and_simulated,
    order_states,
    script,
)
from tests.support.waiting import TIMEOUT, wait_until

LOST = "n1"
LOSS_AT, RETURN_AT = 2.1, 3.1
LEASE_MS = 60_000
# Operator orders in flight at the loss: n1 the source of one, the target of the other.
MANUAL = ((CHAT_FAMILY, CHAT, LOST, "n2"), (DOC_FAMILY, DOC[:256], "n0", LOST))


def loss_script() -> list[Step]:
    """The scenario without loss, n1 lost at LOSS_AT and back at RETURN_AT
    (no heartbeat from it between), with more routes of both families while
    it is down and after it is back."""
    steps: list[Step] = []
    for t, step, args in script():
        if step == "heartbeat" and args[0] == LOST and LOSS_AT < t < RETURN_AT:
            continue  # a dead node's agent sends nothing
        if step == "heartbeat" and args[0] == LOST and t < LOSS_AT:
            args = (LOST, 0.0)  # idle: its chat prefix draws the chat routes until it dies
        if step == "tick" and t == 2.0:
            args = ((LOST,),)  # n1's agent has not got to its orders of this tick when it dies
        steps.append((t, step, args))
    steps += [(2.05, "submit", spec) for spec in MANUAL]
    steps += [(LOSS_AT, "lose", (LOST,)), (RETURN_AT, "come_back", (LOST,))]
    for k, t in enumerate((2.2, 2.6, 3.3, 3.5, 4.2)):
        steps.append((t, "route", (f"chat-x{k}", CHAT + [7000 + k], (len(CHAT) + 1) * BS, CHAT_FAMILY)))
    for k, t in enumerate((2.4, 3.4, 4.4)):
        steps.append((t, "route", (f"doc-x{k}", DOC + [8000 + k], (len(DOC) + 1) * BS, DOC_FAMILY)))
    return sorted(steps, key=lambda s: s[0])  # stable: at one time, the order written above


class LiveWithKVStore(Live):
    """The live scheduler with n1 a real kvstore server whose KV event
    stream the scheduler follows, with loss detection as build_server wires
    it (EventSync(lost=_LossRule(core).node_lost, probe_s=loss_probe_s))."""

    def __init__(self, config: SchedulerConfig, clock: ManualClock, stack: contextlib.ExitStack) -> None:
        super().__init__(config, clock, stack)
        self._stack = stack
        self.event_sync = EventSync(self.core.apply_kv_event, self.core.reset_inventory,
                                    build_telemetry("scheduler", {}), lost=_LossRule(self.core).node_lost,
                                    probe_s=config.loss_probe_s)
        stack.callback(self.event_sync.stop_all)
        self.kvstore = self._start_kvstore()

    def _start_kvstore(self) -> ServiceServer:
        g = geometry_from_proto(GEOMETRY)
        config = KVStoreConfig(node_id=LOST, geometry="tiny", block_size=g.block_size, num_layers=g.num_layers,
                               num_kv_heads=g.num_kv_heads, head_dim=g.head_dim, dtype=g.dtype,
                               device_pages=2 * len(CHAT))
        server = build_kvstore_server(config, build_telemetry("kvstore", {})).start()
        self._stack.callback(server.stop, 1.0)
        return server

    def address(self, node: str) -> str:
        return self.kvstore.address if node == LOST else super().address(node)

    def register(self, node: str, address: str = "") -> None:
        """RegisterNode; for n1 then what the server's _NodeWiring does on a
        registration: (re)start the event stream of that generation."""
        super().register(node, address or self.address(node))
        if node == LOST:
            self.event_sync.follow(NodeId(node), address or self.address(node), self.core.generation(node))

    def store(self, node: str, chain: list[int], family: str, event: EventType = EventType.STORED) -> None:
        """n1: PutBlocks into its kvstore, then wait until its event stream
        has brought the chain into the index (the manual clock stands still)."""
        if node != LOST:
            super().store(node, chain, family, event)
            return
        channel = grpc.insecure_channel(self.kvstore.address)
        try:
            assert put(kvstore_pb2_grpc.KVStoreStub(channel), *chain, family=family,
                       geometry=geometry_from_proto(GEOMETRY)).stored == len(chain)
        finally:
            channel.close()
        assert wait_until(lambda: self.nodes()[node].num_blocks == len(chain))

    def submit(self, family: str, chain: list[int], source: str, target: str) -> None:
        self.stub.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
            family=family, block_hashes=chain, source_node=source, target_node=target, lease_ms=LEASE_MS)),
            timeout=TIMEOUT)

    def lose(self, node: str) -> None:
        """n1's kvstore stops; wait until the scheduler has declared n1 down
        (its event stream closed, the reconnect refused)."""
        assert node == LOST
        self.kvstore.stop(0.5)
        assert wait_until(lambda: not self.nodes()[node].alive), "the live scheduler never declared n1 lost"

    def come_back(self, node: str) -> None:
        """A new kvstore process for n1, at a new address, registers."""
        self.kvstore = self._start_kvstore()
        self.register(node)


def sim_submit(pair: Pair, family: str, chain: list[int], source: str, target: str) -> None:
    pair.sim.core.submit_order(OrderSpec(Family(family), list(chain), NodeId(source), NodeId(target), LEASE_MS))


def sim_lose(pair: Pair, node: str) -> None:
    """As loadgen/sim/simulation.py's _kill declares a loss to the core."""
    assert pair.sim.core.node_lost(NodeId(node), "simulated kill: its event stream closed")


def assert_same_orders(pair: Pair, t: float) -> dict[str, tuple]:
    """Every order's state and message by id, the same on both sides."""
    live, sim = order_states(pair.live.core), order_states(pair.sim.core)
    assert live == sim, (pair.policy, t, "live", live, "simulated", sim)
    return live


def holds(pair: Pair, node: str) -> tuple[int, int]:
    """The blocks node holds in the live index (GetClusterState) and the simulated one."""
    sim = {n.view.node_id: n.view.num_blocks for n in pair.sim.core.cluster_state().nodes}
    return pair.live.nodes()[node].num_blocks, sim[node]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_same_decisions_live_and_simulated_through_a_loss(policy: str, tmp_path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Through n1's loss and return, live and simulated route every request
    to the same node with the same cached prefix, tick the same orders and
    fail the same orders for the same reason; neither routes to n1 while it
    is down, and neither index gives the returned n1 anything it held."""
    steps = loss_script()
    with live_and_simulated(policy, ManualClock(START), steps, tmp_path, live_type=LiveWithKVStore) as pair:
        live = pair.live
        assert isinstance(live, LiveWithKVStore)
        down = False
        failed: set[str] = set()
        chat_before: list[tuple[str, int]] = []
        generation = live.core.generation(LOST), pair.sim.core.generation(LOST)
        for t, step, args in steps:
            pair.at(t)
            if step == "route":
                node, cached = pair.route(t, args)
                assert not (down and node == LOST), (policy, t, args[0], "routed to the lost node")
                if t < LOSS_AT and args[3] == CHAT_FAMILY:
                    chat_before.append((node, cached))
            elif step == "tick":
                pair.tick(t, *args)
                assert_same_orders(pair, t)
            elif step == "submit":
                live.submit(*args)
                sim_submit(pair, *args)
            elif step == "lose":
                before = assert_same_orders(pair, t)
                failed = {k for k, s in before.items() if LOST in s[3:5] and s[0] in ("ISSUED", "IN_FLIGHT")}
                live.lose(*args)
                assert any(r.getMessage().startswith(f"node {LOST} lost (its kvstore's event stream closed")
                           for r in caplog.records), "the live loss was not declared by n1's event stream"
                sim_lose(pair, *args)
                down = True
                states = assert_same_orders(pair, t)
                assert len(failed) >= len(MANUAL), (policy, before)  # n1 had orders in flight
                for k in failed:
                    assert states[k][:2] == ("FAILED", f"{'source' if states[k][3] == LOST else 'target'} "
                                                       f"node {LOST} is down"), (policy, k, states[k])
                assert all(states[k] == s for k, s in before.items() if k not in failed), policy  # only those
                assert holds(pair, LOST) == (0, 0)
            elif step == "come_back":
                live.come_back(*args)
                pair.sim.register(LOST, live.address(LOST))
                down = False
                assert holds(pair, LOST) == (0, 0), policy
                assert live.core.generation(LOST) > generation[0] and pair.sim.core.generation(LOST) > generation[1]
            else:
                pair.step(t, step, args)
        assert (LOST, len(CHAT)) in chat_before, chat_before  # its family went to it, cached, until it died
        assert holds(pair, LOST) == (0, 0), policy  # nothing came back to the index with it
        states = assert_same_orders(pair, steps[-1][0])
        assert all(states[k][0] == "FAILED" for k in failed)  # failed stays failed
        assert pair.routes == 16 + 8
        print(f"{policy}: {pair.decisions} orders, {len(failed)} naming {LOST} failed at its loss, "
              f"the same live and simulated")
        if policy != "none":
            assert pair.decisions > 0, policy

