"""Each policy on a small scripted scenario does what its prose says; routing
with candidate pruning picks what scoring every node would."""
import random

import pytest

from speckv.services.common.ids import Family
from speckv.services.common.traces.records import TraceRequest
from speckv.services.scheduler.forecasts import TraceFutureArrivals
from speckv.services.scheduler.holder_index import HolderEventKind
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.orders import OrderState
from speckv.services.scheduler.routing.router import Candidate, RouteQuery
from tests.support.scheduler_scenarios import BS, CHAIN, FAMILY, heartbeat_all, load, make_core, route_family, store


def test_none_never_replicates():
    core, clock = make_core(3, "none")
    store(core, "n0", CHAIN)
    route_family(core, 50)
    assert core.tick() == []


def test_reactive_heat_fans_a_hot_family_out_one_replica_per_heat_step():
    core, clock = make_core(6, "reactive-heat", reactive_heat={"heat_threshold": 8, "heat_per_replica": 8,
                                                               "max_replicas": 3})
    store(core, "n0", CHAIN)
    load(core, "n3", 50_000)  # busy: not a target
    route_family(core, 7)
    assert core.tick() == []  # 7 routes in the window: not hot yet
    route_family(core, 17)  # 24 routes: wants 1 + 24 // 8 = 4, capped at 3 holders
    orders = core.tick()
    assert [o.spec.source for o in orders] == ["n0", "n0"]
    assert "n3" not in {o.spec.target for o in orders} and all(o.spec.block_hashes == CHAIN for o in orders)
    assert core.tick() == []  # the two landing replicas count: nothing more
    clock.advance(11.0)  # the heat window passes
    heartbeat_all(core, 6)
    assert core.tick() == []


def test_reactive_migrate_moves_the_hottest_family_off_an_overloaded_node():
    core, clock = make_core(4, "reactive-migrate")
    store(core, "n0", CHAIN)
    store(core, "n0", list(range(9000, 9010)), family="cold")
    route_family(core, 5)
    route_family(core, 1, family="cold", chain=list(range(9000, 9010)))
    assert core.tick() == []  # n0's queue is short: nothing to move
    load(core, "n0", 100_000)  # 3.5 s of queued prefill > 1 s threshold
    load(core, "n1", 20_000)  # 0.7 s: above the 250 ms a target may have
    orders = core.tick()
    assert len(orders) == 1 and orders[0].spec.family == FAMILY and orders[0].spec.source == "n0"
    assert orders[0].spec.target in {"n2", "n3"} and orders[0].spec.policy == "reactive-migrate"
    assert core.tick() == []  # cooldown


def test_oracle_replicates_before_the_burst_the_trace_holds():
    burst = [TraceRequest(30.0 + i * 0.001, 2067, 10, tuple(CHAIN), BS, FAMILY) for i in range(200)]
    future = TraceFutureArrivals(burst, time_offset_s=80.0)  # scheduler t=110 is trace t=30
    core, clock = make_core(4, "oracle", future=future, planner={"horizon_s": 1.0})
    store(core, "n0", CHAIN)
    route_family(core, 1)
    clock.set(107.0)
    heartbeat_all(core, 4)
    assert core.tick() == []  # the burst is 3 s away, beyond the 1 s horizon
    clock.set(109.5)
    heartbeat_all(core, 4)
    orders = core.tick()
    assert len(orders) >= 1 and all(o.spec.policy == "oracle" and o.spec.source == "n0" for o in orders)
    assert future.counts(109.5, 110.5) == {FAMILY: 200} and future.counts(100.0, 109.5) == {}


def test_routing_prefers_the_longest_prefix_until_its_queue_makes_another_node_cheaper():
    core, clock = make_core(3)
    store(core, "n0", CHAIN)
    store(core, "n1", CHAIN[:32])
    assert route_family(core, 1) == ["n0"]
    load(core, "n0", 60_000)  # ~2.1 s of queue: recomputing 1,536 tokens on n1 is cheaper
    assert route_family(core, 1) == ["n1"]
    load(core, "n1", 60_000)
    assert route_family(core, 1) == ["n2"]  # pulls or recomputes on the idle node


@pytest.mark.parametrize("nodes, shared_root, seed", [(60, False, 3), (40, True, 5)])
def test_pruned_candidates_choose_what_scoring_every_node_would(nodes, shared_root, seed):
    # shared_root: a system-prompt block most nodes hold, so routing walks only
    # the deeper holders plus the least queued; it must still pick what
    # scoring every node would.
    rng = random.Random(seed)
    core, clock = make_core(nodes)
    root = [7] if shared_root else []
    for i in range(nodes):
        load(core, f"n{i}", rng.randrange(0, 80_000))
        if shared_root and i % 7:  # a few nodes do not hold it: they compete as non-holders
            store(core, f"n{i}", root, family="system")
    for k in range(30):
        chain = root + [1_000_000 * (k + 1) + j for j in range(rng.randrange(1 - len(root), 64 - 24 * len(root)))]
        for node in rng.sample(range(nodes), rng.randrange(0, 4)):
            store(core, f"n{node}", chain[: rng.randrange(1, len(chain) + 1)], family=f"f{k}")
        query = RouteQuery("r", chain, len(chain) * BS + 5, Family(f"f{k}"))
        best = min(_full_estimate(core, query), key=lambda d: d.expected_ttft_ms)
        got = core.route("r", chain, len(chain) * BS + 5, f"f{k}")
        assert got.expected_ttft_ms <= best.expected_ttft_ms + 1.0 + 1e-6  # within the tie band
        assert got.cached_blocks == core._index.longest_prefix(got.node_id, chain)
        load(core, got.node_id, rng.randrange(0, 80_000))


def _full_estimate(core, query):
    """Every live node scored (what pruning must match), from the core's own parts."""
    now = core._clock.now()
    lengths = core._index.prefix_lengths(query.block_hashes)
    cands = [Candidate(n.node_id, n.pending_requests, lengths.get(n.node_id, 0), n.geometry.block_size, n.bytes_per_block,
                       core._cluster.queue_ms(n))
             for n in core._cluster.live_nodes(now)]
    from speckv.services.scheduler.routing.router import best_holder
    holder = best_holder(cands)
    return [core._router.estimate(query, c, holder) for c in cands]


def test_reactive_heat_does_not_count_a_node_holding_only_the_shared_first_block_as_a_holder():
    # Every conversation starts with the same system-prompt block, so every
    # node holds CHAIN[0]; only n0 holds the conversation itself. Holding one
    # 16-token block saves far less than min_benefit_ms: those nodes are targets.
    core, clock = make_core(6, "reactive-heat", reactive_heat={"heat_threshold": 8, "heat_per_replica": 8,
                                                               "max_replicas": 3})
    for i in range(1, 6):
        store(core, f"n{i}", CHAIN[:1], family="system")
    store(core, "n0", CHAIN)
    route_family(core, 24)  # wants 1 + 24 // 8 = 4, capped at 3 holders
    orders = core.tick()
    assert len(orders) == 2 and {o.spec.source for o in orders} == {"n0"}
    assert all(o.spec.block_hashes == CHAIN and o.spec.target != "n0" for o in orders)


def test_reactive_migrate_copies_to_a_node_holding_only_the_shared_first_block():
    core, clock = make_core(3, "reactive-migrate")
    store(core, "n1", CHAIN[:1], family="system")
    store(core, "n2", CHAIN[:1], family="system")
    store(core, "n0", CHAIN)
    route_family(core, 5)
    load(core, "n0", 100_000)  # 3.5 s of queued prefill > 1 s threshold
    orders = core.tick()
    assert len(orders) == 1 and orders[0].spec.source == "n0" and orders[0].spec.block_hashes == CHAIN
    assert orders[0].spec.target in {"n1", "n2"}


def _commit(core, order):
    """The order's copy lands on its target: the KV event, then the agent's report."""
    store(core, order.spec.target, order.spec.block_hashes, kind=HolderEventKind.COMMITTED)
    core.report_order(order.order_id, OrderState.COMMITTED, "committed", 0, len(order.spec.block_hashes))


def test_reactive_heat_waits_out_its_action_cooldown_before_another_copy_of_a_family():
    core, clock = make_core(6, "reactive-heat", reactive_heat={"max_replicas": 3})
    store(core, "n0", CHAIN)
    route_family(core, 8)  # hot: wants 1 + 8 // 8 = 2 holders
    first = core.tick()
    assert len(first) == 1
    _commit(core, first[0])
    route_family(core, 16)  # 24 routes: wants 3 holders, but the last copy was just made
    assert core.tick() == []
    clock.advance(29.0)
    heartbeat_all(core, 6)
    route_family(core, 24)
    assert core.tick() == []  # 29 s < the 30 s cooldown
    clock.advance(2.0)
    heartbeat_all(core, 6)
    assert len(core.tick()) == 1


def test_reactive_heat_pauses_before_re_creating_a_replica_that_was_evicted():
    core, clock = make_core(6, "reactive-heat")
    store(core, "n0", CHAIN)
    route_family(core, 8)
    order = core.tick()[0]
    _commit(core, order)
    clock.advance(31.0)  # past the cooldown
    heartbeat_all(core, 6)
    store(core, order.spec.target, CHAIN, kind=HolderEventKind.REMOVED)  # the replica is evicted
    route_family(core, 8)
    assert core.tick() == []  # noticed gone: no re-creation for 60 s
    clock.advance(59.0)
    heartbeat_all(core, 6)
    route_family(core, 8)
    assert core.tick() == []
    clock.advance(2.0)
    heartbeat_all(core, 6)
    route_family(core, 8)
    again = core.tick()
    assert len(again) == 1 and again[0].spec.source == "n0"


def test_the_committed_reactive_heat_is_mooncake_s_fan_out():
    s = load_policy_config().reactive_heat
    window = load_policy_config().families.heat_window_s
    assert s.heat_threshold / window == pytest.approx(0.8) and s.max_replicas == 2
    assert (s.action_cooldown_s, s.recreate_after_s) == (30.0, 60.0)
