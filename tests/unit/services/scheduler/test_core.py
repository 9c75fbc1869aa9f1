from collections import Counter

import pytest

from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from speckv.services.common.ids import Family, NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.ports import SchedulerSettings
from speckv.services.scheduler.orders import OrderSpec, OrderState

CHAIN = list(range(100, 164))  # 64 blocks of 4 tokens (tiny profile)
BS = 4


class Confirmer:
    def __init__(self, answer=None, silent=()):
        self.answer = answer
        self.calls = []
        self.silent = set(silent)  # addresses with no kvstore to ask

    def asks(self, address):
        return address not in self.silent

    def confirm(self, address, hashes):
        self.calls.append(address)
        return self.answer


class Sink:
    def __init__(self):
        self.arrivals = []

    def offer(self, a):
        self.arrivals.append(a)
        return True


class Listener:
    def __init__(self):
        self.seen = []

    def node_registered(self, node_id, address, generation, old_address):
        self.seen.append((node_id, address, generation, old_address))


@pytest.fixture
def env():
    clock = ManualClock(1000.0)
    confirmer, sink, listener = Confirmer(), Sink(), Listener()
    core = SchedulerCore(SchedulerSettings(node_timeout_s=5.0, link_gbps=1e-3), clock, get_profile("tiny"),
                         confirmer=confirmer, arrivals=sink, listener=listener)
    for n in "abc":
        core.register_node(n, f"h:{n}", NodeSizes(1000), None)
    return core, clock, confirmer, sink, listener


def gen(listener, node):
    return [g for n, _, g, _ in listener.seen if n == node][-1]


def store(core, listener, node, hashes):
    assert core.apply_kv_event(NodeId(node), gen(listener, node), IndexEvent(HolderEventKind.STORED, hashes))


def test_routes_to_cached_node_and_reports_arrival(env):
    core, clock, confirmer, sink, listener = env
    store(core, listener, "b", CHAIN)
    r = core.route("r1", CHAIN, 64 * BS + 5)
    assert r.node_id == "b" and r.cached_blocks == 64 and r.family == str(CHAIN[0])
    assert r.confirmed is False and confirmer.calls == ["h:b"]
    assert sink.arrivals[0].node_id == "b" and sink.arrivals[0].cached_tokens == 64 * BS
    assert sink.arrivals[0].time_s == 1000.0
    assert core.cluster_state().num_families == 1


def test_confirmation_overrides_the_index(env):
    core, clock, confirmer, sink, listener = env
    store(core, listener, "b", CHAIN)
    confirmer.answer = 10  # the node evicted the tail since its last event
    r = core.route("r1", CHAIN, 64 * BS + 5, arrival_time_s=5.0)
    assert r.node_id == "b" and r.cached_blocks == 10 and r.confirmed
    assert sink.arrivals[0].time_s == 5.0 and sink.arrivals[0].cached_tokens == 10 * BS


def test_a_node_with_no_kvstore_to_ask_is_routed_on_the_index_without_a_lookup(env, caplog):
    core, clock, confirmer, sink, listener = env
    confirmer.silent = {"h:b"}  # a vLLM-fed node (--kv-events)
    store(core, listener, "b", CHAIN)
    with caplog.at_level("WARNING"):
        r = core.route("r1", CHAIN, 64 * BS + 5)
    assert r.node_id == "b" and r.cached_blocks == 64 and not r.confirmed
    assert "h:b" not in confirmer.calls and "did not answer" not in caplog.text


def test_burst_spreads_over_nodes_via_pending_load(env):
    core, *_ = env
    picks = Counter(core.route(f"r{i}", [], 2000).node_id for i in range(30))
    assert set(picks) == {"a", "b", "c"} and max(picks.values()) - min(picks.values()) <= 1


def test_down_nodes_get_no_routes_and_come_back(env):
    core, clock, *_ = env
    clock.advance(4.0)
    core.heartbeat("a", NodeLoad())
    clock.advance(2.0)  # b and c are now 6 s silent
    assert {core.route("r", [], 10).node_id for _ in range(5)} == {"a"}
    clock.advance(10.0)
    with pytest.raises(Unavailable):
        core.route("r", [], 10)
    assert core.heartbeat("c", NodeLoad()) is True
    assert core.route("r", [], 10).node_id == "c"
    assert core.heartbeat("zz", NodeLoad()) is False


def test_a_lost_node_is_out_at_once_its_holdings_purged_its_orders_failed(env):
    core, clock, confirmer, sink, listener = env
    store(core, listener, "b", CHAIN)
    old = gen(listener, "b")
    order = core.submit_order(OrderSpec(Family(""), CHAIN[:8], NodeId("b"), NodeId("c"), 1000))
    other = core.submit_order(OrderSpec(Family(""), CHAIN[:8], NodeId("a"), NodeId("c"), 1000))
    assert core.node_lost("b", "event stream closed") is True
    assert core.node_lost("b", "again") is False and core.node_lost("ghost", "x") is False
    assert core.get_order(order.order_id).state is OrderState.FAILED
    assert core.get_order(other.order_id).state is not OrderState.FAILED
    assert {core.route(f"r{i}", CHAIN, 64 * BS + 5).node_id for i in range(6)} <= {"a", "c"}
    assert core.route("r", CHAIN, 64 * BS + 5).cached_blocks == 0  # nobody else held the chain
    assert core.apply_kv_event(NodeId("b"), old, IndexEvent(HolderEventKind.STORED, CHAIN)) is False
    assert core.heartbeat("b", NodeLoad()) is False  # comes back only by registering again
    core.register_node("b", "h:b", NodeSizes(1000), None)
    state = {n.view.node_id: n for n in core.cluster_state().nodes}
    assert state["b"].view.num_blocks == 0  # a new incarnation, no stale holdings
    assert core.node_lost("b", "of an older incarnation", generation=gen(listener, "b") - 1) is False
    assert core.node_lost("b", "removed by the operator", generation=gen(listener, "b")) is True
    with pytest.raises(FailedPrecondition, match="down"):
        core.submit_order(OrderSpec(Family(""), CHAIN[:8], NodeId("a"), NodeId("b"), 1000))


def test_a_node_timed_out_by_the_sweep_is_purged_and_must_register_again(env):
    core, clock, confirmer, sink, listener = env
    store(core, listener, "b", CHAIN)
    clock.advance(4.0)
    core.heartbeat("a", NodeLoad())
    core.heartbeat("c", NodeLoad())
    clock.advance(2.0)  # b is 6 s silent
    core.tick()
    assert core.heartbeat("b", NodeLoad()) is False
    core.register_node("b", "h:b", NodeSizes(1000), None)
    assert {n.view.node_id: n for n in core.cluster_state().nodes}["b"].view.num_blocks == 0


def test_reregistration_resets_inventory_and_stales_old_streams(env):
    core, clock, confirmer, sink, listener = env
    store(core, listener, "b", CHAIN)
    old = gen(listener, "b")
    again, interval = core.register_node("b", "h:b2", NodeSizes(1000), None)
    assert again and interval == 1000 and listener.seen[-1][3] == "h:b"
    assert core.apply_kv_event(NodeId("b"), old, IndexEvent(HolderEventKind.STORED, [1])) is False
    assert core.reset_inventory(NodeId("b"), old) is False
    state = {n.view.node_id: n for n in core.cluster_state().nodes}
    assert state["b"].view.num_blocks == 0 and state["b"].view.address == "h:b2"


@pytest.mark.parametrize("hashes,prompt,match", [
    ([1], 0, "prompt_tokens"),
    ([1, 2, 3], 2, "at least one token"),
    ([1, 2, 3], 10, "exceed"),  # 3 blocks of 4 tokens > 10
    ([1, 1], 100, "repeats"),
    ([-1], 100, "uint64"),
])
def test_route_rejects_malformed(env, hashes, prompt, match):
    with pytest.raises(InvalidArgument, match=match):
        env[0].route("r", hashes, prompt)


def test_route_rejects_negative_arrival_time(env):
    with pytest.raises(InvalidArgument, match="arrival_time_s"):
        env[0].route("r", [], 10, arrival_time_s=-1.0)


def test_route_with_no_nodes_is_unavailable():
    core = SchedulerCore(SchedulerSettings(), ManualClock(), get_profile("tiny"))
    with pytest.raises(Unavailable):
        core.route("r", [1], 100)


def test_orders_need_known_live_nodes(env):
    core, clock, *_ = env
    with pytest.raises(NotFound):
        core.submit_order(OrderSpec(Family(""), [1], NodeId("a"), NodeId("nope"), 100))
    order = core.submit_order(OrderSpec(Family(""), [7, 8], NodeId("a"), NodeId("b"), 1000))
    assert order.spec.target_address == "h:b" and order.spec.family == "7" and order.spec.policy == "manual"
    clock.advance(6.0)
    core.heartbeat("a", NodeLoad())
    with pytest.raises(FailedPrecondition, match="down"):
        core.submit_order(OrderSpec(Family(""), [7, 8], NodeId("a"), NodeId("b"), 1000))


def test_watch_gets_backlog_then_new_orders(env):
    core, *_ = env
    first = core.submit_order(OrderSpec(Family("f"), [1], NodeId("a"), NodeId("b"), 5000))
    done = core.submit_order(OrderSpec(Family("f"), [2], NodeId("a"), NodeId("b"), 5000))
    core.report_order(done.order_id, OrderState.COMMITTED)
    w = core.watch_orders("a")
    assert w.next(0.01).order_id == first.order_id and w.next(0.01) is None
    later = core.submit_order(OrderSpec(Family("f"), [3], NodeId("a"), NodeId("c"), 5000))
    core.submit_order(OrderSpec(Family("f"), [3], NodeId("b"), NodeId("c"), 5000))  # other source
    assert w.next(0.01).order_id == later.order_id and w.next(0.01) is None
    with pytest.raises(NotFound):
        core.watch_orders("ghost")
    core.close()
    assert w.closed


def tiered_core():
    clock = ManualClock(1000.0)
    core = SchedulerCore(SchedulerSettings(node_timeout_s=5.0, link_gbps=1e-3, host_link_gbps=100.0,
                                           host_link_overhead_ms=0.0), clock, get_profile("tiny"))
    core.register_node("a", "h:a", NodeSizes(1000, 500), None)
    core.register_node("b", "h:b", NodeSizes(1000), None)
    return core


def test_an_order_takes_the_target_s_host_tier_by_default_and_may_not_name_a_missing_one():
    core = tiered_core()
    assert core.submit_order(OrderSpec(Family(""), [7], NodeId("b"), NodeId("a"), 1000)).spec.tier is Tier.HOST
    assert core.submit_order(OrderSpec(Family(""), [7], NodeId("a"), NodeId("b"), 1000)).spec.tier is Tier.DEVICE
    named = OrderSpec(Family(""), [8], NodeId("b"), NodeId("a"), 1000, tier=Tier.DEVICE)
    assert core.submit_order(named).spec.tier is Tier.DEVICE
    with pytest.raises(FailedPrecondition, match="host tier of node 'b'"):
        core.submit_order(OrderSpec(Family(""), [7], NodeId("a"), NodeId("b"), 1000, tier=Tier.HOST))


def test_a_route_to_host_tier_hits_names_the_blocks_to_promote():
    core = tiered_core()
    a = core.generation("a")
    core.apply_kv_event(NodeId("a"), a, IndexEvent(HolderEventKind.STORED, CHAIN[:8]))
    core.apply_kv_event(NodeId("a"), a, IndexEvent(HolderEventKind.STORED, CHAIN[4:8], tier=Tier.HOST))
    core.apply_kv_event(NodeId("a"), a, IndexEvent(HolderEventKind.REMOVED, CHAIN[4:8]))
    result = core.route("r", CHAIN[:8], 8 * BS + 1)
    assert result.node_id == "a" and result.cached_blocks == 8 and result.promote_blocks == 4
    assert result.promote_ms > 0 and result.expected_ttft_ms > result.prefill_ms + result.promote_ms - 1e-9


def test_a_negative_host_tier_is_refused():
    core = tiered_core()
    with pytest.raises(InvalidArgument, match="host_pages"):
        core.register_node("c", "h:c", NodeSizes(1000, -1), None)


@pytest.mark.parametrize("host_pages, cap", [(400, 401), (0, 1001), (400, -1)])
def test_a_retention_cap_beyond_the_last_tier_is_refused(host_pages, cap):
    core = tiered_core()
    with pytest.raises(InvalidArgument, match="retain_max_blocks"):
        core.register_node("c", "h:c", NodeSizes(1000, host_pages, cap), None)
    largest = cap - 1 if cap > 0 else 0
    assert core.register_node("c", "h:c", NodeSizes(1000, host_pages, largest), None)[0] is False  # it registers
