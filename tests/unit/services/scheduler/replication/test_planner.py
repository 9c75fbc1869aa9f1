"""The planner through the `predictive` policy on scripted forecasts, and the
order lifecycle around it (leases, retries, commits seen in KV events)."""
import dataclasses

import pytest

from speckv.services.common.errors import FailedPrecondition, InvalidArgument
from speckv.services.common.ids import NodeId
from speckv.services.common.tiers import Tier
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.forecasts import ForecastKind
from speckv.services.scheduler.holder_index import HolderEventKind, IndexEvent
from speckv.services.scheduler.policy_config import load_policy_config
from speckv.services.scheduler.orders import ActionKind, OrderSpec, OrderState
from tests.support.scheduler_scenarios import (
    CHAIN,
    FAMILY,
    ScriptedForecasts,
    heartbeat_all,
    make_core,
    route_family,
    store,
)

TIGHT = {"planner": {"horizon_s": 1.0, "plan_every_s": 0.0}}  # plans on every tick


def predictive(nodes=4, **overrides):
    forecasts = ScriptedForecasts()
    core, clock = make_core(nodes, "predictive", forecasts, **{**TIGHT, **overrides})
    store(core, "n0", CHAIN)
    route_family(core, 2)  # the catalog learns the family's chain and prompt length
    heartbeat_all(core, nodes)
    return core, clock, forecasts


def test_replicates_ahead_of_a_forecast_burst_and_not_without_one():
    core, clock, forecasts = predictive()
    assert core.tick() == []  # nothing forecast
    forecasts.counts = {FAMILY: 3.0}
    assert core.tick() == []  # forecast, but the holder serves 3 in a second without queueing
    forecasts.counts = {FAMILY: 200.0}
    orders = core.tick()
    # 200 requests in 1 s: the holder takes one per 15.7 ms (64/s), a node
    # recomputing one per 90 ms (11/s) and pulls take turns on n0's link
    # (87 ms each), so the cluster falls behind until replicas turn the
    # other three nodes into holders; each still cuts queueing, at no cost
    # (empty targets, no other transfers): all three are worth it.
    assert len(orders) == 3
    assert {o.spec.source for o in orders} == {"n0"} and "n0" not in {o.spec.target for o in orders}
    assert all(o.spec.block_hashes == CHAIN and o.spec.policy == "predictive" for o in orders)
    assert all(o.spec.lease_ms == 15000 and o.spec.expected_benefit_ms > 0 for o in orders)
    assert core.tick() == []  # orders landing count as holders: no non-holder is left


@pytest.mark.parametrize("demand, expected, upper, replicates", [
    ("expected_count", 0.5, 200.0, False),  # unlikely to come: no bytes on a long tail
    ("expected_count", 200.0, 200.0, True),
    ("upper_quantile", 0.5, 200.0, True),
    ("upper_quantile", 200.0, 200.0, True),
])
def test_demand_is_the_forecast_figure_the_config_names(demand, expected, upper, replicates):
    core, clock, forecasts = predictive(planner={**TIGHT["planner"], "demand": demand})
    forecasts.counts, forecasts.uppers = {FAMILY: expected}, {FAMILY: upper}
    assert bool(core.tick()) is replicates


def test_the_committed_planner_weighs_a_forecast_by_its_expected_count():
    """policies.json's demand_note says why (a held-out trace, not the evaluation one)."""
    core, clock, forecasts = predictive()
    forecasts.counts, forecasts.uppers = {FAMILY: 0.5}, {FAMILY: 200.0}
    assert core.tick() == []


def test_unstarted_orders_are_cancelled_when_the_burst_is_no_longer_forecast():
    core, clock, forecasts = predictive()
    forecasts.counts = {FAMILY: 200.0}
    first, *_, second = core.tick()
    core.report_order(first.order_id, OrderState.IN_FLIGHT)
    forecasts.counts = {}
    core.tick()
    assert core.get_order(second.order_id).state is OrderState.CANCELLED
    assert core.get_order(first.order_id).state is OrderState.IN_FLIGHT  # started: left to finish
    with pytest.raises(FailedPrecondition):
        core.cancel_order(first.order_id)


def test_link_and_memory_budgets_are_never_exceeded():
    core, clock, forecasts = predictive(nodes=6, budgets={"max_orders_per_tick": 1000})
    families = {}
    for k in range(30):  # 30 bursting families, all held only by n0: its egress is the bottleneck
        chain = list(range(100_000 * (k + 1), 100_000 * (k + 1) + 128))
        store(core, "n0", chain, family=f"f{k}")
        route_family(core, 1, family=f"f{k}", chain=chain)
        families[f"f{k}"] = 500.0
    heartbeat_all(core, 6)
    forecasts.counts = families
    for _ in range(3):
        clock.advance(0.25)
        heartbeat_all(core, 6)
        core.tick()
    active = [core.get_order(f"o-{i:08d}") for i in range(1, 1000) if _exists(core, f"o-{i:08d}")]
    config = core.context.config.budgets
    budget = config.link_budget_fraction * 25e9 / 8 * config.link_budget_window_s
    block_bytes = 2 * 1024 * 1024
    egress = sum(len(o.spec.block_hashes) * block_bytes for o in active if o.spec.source == "n0")
    assert 0 < egress <= budget
    for target in {o.spec.target for o in active}:
        blocks = sum(len(o.spec.block_hashes) for o in active if o.spec.target == target)
        assert blocks <= config.replica_memory_fraction * 4096
        assert blocks * block_bytes <= budget


def _exists(core, order_id):
    try:
        core.get_order(order_id)
        return True
    except Exception:
        return False


def test_leases_release_unused_replicas_and_keep_used_ones():
    core, clock = make_core(3)
    store(core, "n0", CHAIN)
    used = core.submit_order(OrderSpec(FAMILY, CHAIN, NodeId("n0"), NodeId("n1"), lease_ms=2000))
    unused = core.submit_order(OrderSpec(FAMILY, CHAIN, NodeId("n0"), NodeId("n2"), lease_ms=2000))
    core.report_order(used.order_id, OrderState.COMMITTED, bytes_sent=100)
    store(core, "n2", CHAIN, kind=HolderEventKind.COMMITTED)  # n2's events show the replica: committed
    assert core.get_order(unused.order_id).state is OrderState.COMMITTED
    store(core, "n1", CHAIN, kind=HolderEventKind.COMMITTED)
    heartbeat_all(core, 3)
    core.heartbeat("n0", NodeLoad(queued_tokens=10_000_000))  # n0 is swamped: the next request goes to a replica
    core.heartbeat("n2", NodeLoad(queued_tokens=5_000_000))
    assert route_family(core, 1) == ["n1"]
    clock.advance(2.5)
    heartbeat_all(core, 3)
    core.tick()
    stats = core.cluster_state().replicas
    assert (stats.committed, stats.kept, stats.released_unused) == (2, 1, 1)
    assert stats.bytes_wasted == 128 * 2 * 1024 * 1024


def test_a_failed_order_is_retried_from_another_holder():
    core, clock = make_core(4)
    store(core, "n0", CHAIN)
    store(core, "n1", CHAIN)
    order = core.submit_order(OrderSpec(FAMILY, CHAIN, NodeId("n0"), NodeId("n3"), lease_ms=5000))
    w = core.watch_orders("n1")
    core.report_order(order.order_id, OrderState.FAILED, "source lost the blocks")
    retry = w.next(1.0)
    assert retry is not None and retry.spec.source == "n1" and retry.spec.target == "n3"
    core.report_order(retry.order_id, OrderState.FAILED, "again")
    assert w.next(0.01) is None  # no holder left untried
    assert core.cluster_state().retries == 1


def test_a_node_going_down_fails_its_orders():
    core, clock = make_core(3)
    store(core, "n0", CHAIN)
    order = core.submit_order(OrderSpec(FAMILY, CHAIN, NodeId("n0"), NodeId("n1"), lease_ms=60_000))
    clock.advance(4.0)
    core.heartbeat("n0", NodeLoad())
    clock.advance(2.0)  # n1 (the target) is now 6 s silent
    core.tick()
    failed = core.get_order(order.order_id)
    assert failed.state is OrderState.FAILED and "target node n1 is down" in failed.message


def test_a_node_holding_only_the_shared_system_prompt_is_a_candidate_not_a_holder():
    """Conversation families share block 0 (a system prompt) that every node
    holds: holding it must not count as holding the conversation."""
    core, clock, forecasts = predictive(nodes=3)
    for node in ("n1", "n2"):
        store(core, node, CHAIN[:1], "another-conversation")
    core.heartbeat("n0", NodeLoad(queued_tokens=10_000_000))  # the holder is swamped
    forecasts.counts = {FAMILY: 1.0}
    orders = core.tick()
    assert len(orders) == 1 and orders[0].spec.source == "n0" and orders[0].spec.target in {"n1", "n2"}
    assert orders[0].spec.block_hashes == CHAIN


def test_a_holder_whose_queue_already_breaks_the_target_serves_no_returning_request():
    """One request forecast within the horizon may arrive at once: a holder
    with queue + prefill above the TTFT target cannot take it, even though a
    late arrival would find its queue drained."""
    core, clock, forecasts = predictive(planner={"horizon_s": 2.0, "plan_every_s": 0.0})
    queued = next(t for t in range(0, 10_000_000, 1000)  # a queue between T and H + T
                  if 2200.0 < core.context.profile.queue_ms(t, 1) < 3000.0)
    core.heartbeat("n0", NodeLoad(queued_tokens=queued, waiting_requests=1))
    forecasts.counts = {FAMILY: 1.0}
    orders = core.tick()
    assert len(orders) == 1 and orders[0].spec.source == "n0"


def test_a_prefix_longer_than_the_link_budget_is_copied_alone_on_its_links():
    """2,048 blocks of 2 MiB (4.3 GB) exceed a link's budget (half of 2 s at
    25 Gbit/s, 3.1 GB): such an order may still go, alone on its source's
    and target's links, and nothing else is added on them while it is active."""
    long_chain = list(range(200_000, 202_048))
    forecasts = ScriptedForecasts()
    # Room for 4,096 replica blocks; a 5 s horizon, so a 1.4 s copy lands in time.
    core, clock = make_core(4, "predictive", forecasts, capacity=16_384, planner={"horizon_s": 5.0})
    store(core, "n0", CHAIN)
    store(core, "n0", long_chain, family="long")
    route_family(core, 2)
    route_family(core, 2, family="long", chain=long_chain)
    busy_n0_and_idle_others(core)
    config = core.context.config.budgets
    assert len(long_chain) * 2 * 2**20 > config.link_budget_fraction * 25e9 / 8 * config.link_budget_window_s
    forecasts.counts = {"long": 500.0}
    orders = core.tick()
    assert [(o.spec.family, o.spec.source) for o in orders] == [("long", "n0")]  # one, alone on n0's link
    assert orders[0].spec.block_hashes == long_chain
    clock.advance(0.25)
    busy_n0_and_idle_others(core)
    forecasts.counts = {"long": 500.0, FAMILY: 500.0}
    assert core.tick() == []  # n0, the only holder of both, is still sending the long one


def busy_n0_and_idle_others(core):
    """n0's queue alone breaks the 2 s target: it serves no forecast request."""
    heartbeat_all(core, 4, free_pages=16_384)
    core.heartbeat("n0", NodeLoad(free_pages=16_384, queued_prefill_ms=3_000.0))


def _one_request_behind_a_swamped_holder(p_reuse: float, fill_targets: bool, **planner):
    """n0 holds the 128-block chain with 3 s of queue; one request of the
    family is forecast within 2 s (priced at 1 s); targets hold 512 pages."""
    forecasts = ScriptedForecasts()
    core, clock = make_core(4, "predictive", forecasts, capacity=512,
                            planner={"horizon_s": 2.0, "plan_every_s": 0.0, **planner},
                            reuse={"prior_p": p_reuse, "prior_weight": 1e6})
    store(core, "n0", CHAIN)
    route_family(core, 2)
    if fill_targets:
        for i in (1, 2, 3):
            store(core, f"n{i}", list(range(100_000 * i, 100_000 * i + 512)), family=f"filler{i}")
    heartbeat_all(core, 4)
    core.heartbeat("n0", NodeLoad(queued_prefill_ms=3000.0))
    forecasts.counts = {FAMILY: 1.0}
    return core


@pytest.mark.parametrize("p_reuse, fill_targets, admitted", [
    (1.0, True, False),  # the 128 blocks it pushes out cost 89 ms of recompute: more than it saves
    (0.0, True, True),  # pushed-out blocks nobody wants again cost nothing
    (1.0, False, True),  # empty targets: nothing pushed out
])
def test_a_replica_whose_evictions_cost_more_than_it_saves_is_refused(p_reuse, fill_targets, admitted):
    """Without the replica the request recomputes on an idle node
    (prefill_ms(2067, 0) = 89.8 ms; the holder's queue and a 102.6 ms pull
    are worse); with it, it finds the chain cached: prefill_ms(19, 2048) =
    15.7 ms, after the copy has landed (87 ms). Saving 74.1 ms. A full
    target pushes out 128 blocks, each reused with p_reuse at a recompute of
    89.8 ms / (2067 / 16) blocks = 0.695 ms: 89.0 ms at p = 1."""
    core = _one_request_behind_a_swamped_holder(p_reuse, fill_targets)
    profile = core.context.profile
    saving = profile.prefill_ms(2067, 0) - profile.prefill_ms(19, 2048)
    orders = core.tick()
    assert bool(orders) is admitted
    if admitted:
        assert len(orders) == 1 and orders[0].spec.source == "n0"
        assert orders[0].spec.expected_benefit_ms == pytest.approx(saving)


CHAIN_GIB = len(CHAIN) * 2 * 2**20 / 2**30  # llama-3-8b: 2 MiB a 16-token block; 0.25 GiB


@pytest.mark.parametrize("ms_per_gib, admitted", [
    (0.0, True),
    (280.0, True),  # 70 ms for its 0.25 GiB: 4.1 ms of net left
    (300.0, False),  # 75 ms: more than the 74.1 ms it saves
])
def test_a_copy_pays_for_the_bytes_it_sends(ms_per_gib, admitted):
    """The replica of the eviction test above (empty targets) saves 74.1 ms
    and sends the 128-block chain, 0.25 GiB, over the network; at
    copy_ms_per_gib its net is that saving less 0.25 x the price."""
    core = _one_request_behind_a_swamped_holder(1.0, False, copy_ms_per_gib=ms_per_gib)
    profile = core.context.profile
    saving = profile.prefill_ms(2067, 0) - profile.prefill_ms(19, 2048)
    orders = core.tick()
    assert bool(orders) is admitted
    if admitted:
        assert orders[0].spec.expected_benefit_ms == pytest.approx(saving - ms_per_gib * CHAIN_GIB)


def test_a_prefetch_sends_nothing_over_the_network_and_pays_no_byte_price():
    core = _host_only_holder(device_full=False, copy_ms_per_gib=1e6)
    assert [o.spec.action for o in core.tick()] == [ActionKind.PREFETCH]


@pytest.mark.parametrize("price", [-1.0, float("nan"), float("inf")])
def test_a_byte_price_must_be_finite_and_not_negative(price):
    config = load_policy_config()
    bad = dataclasses.replace(config, planner=dataclasses.replace(config.planner, copy_ms_per_gib=price))
    with pytest.raises(InvalidArgument, match="copy_ms_per_gib"):
        bad.validate()


def test_no_ttft_target_caps_a_fan_out():
    """A burst that queues the holder far past the 2 s TTFT target is still
    spread: the planner prices the queueing it avoids, however long."""
    core, clock, forecasts = predictive(planner={"horizon_s": 2.0, "plan_every_s": 0.0})
    core.heartbeat("n0", NodeLoad(queued_prefill_ms=10_000.0))
    forecasts.counts = {FAMILY: 100.0}
    orders = core.tick()
    # Recomputing on the three others serves 33 requests a second of the 50
    # forecast; two replicas serve 128: the third would save little.
    assert len(orders) >= 2 and {o.spec.target for o in orders} <= {"n1", "n2", "n3"}
    assert sum(o.spec.expected_benefit_ms for o in orders) > 100 * 74.0  # every request saves a recompute or more


def _host_only_holder(device_full: bool, **planner):
    """One node (no peer to copy to) holding the chain in its host tier only."""
    forecasts = ScriptedForecasts()
    core, clock = make_core(1, "predictive", forecasts, capacity=512, host_pages=1024,
                            planner={"horizon_s": 2.0, **planner}, reuse={"prior_p": 1.0, "prior_weight": 1e6})
    assert core.apply_kv_event(NodeId("n0"), core.generation("n0"),
                               IndexEvent(HolderEventKind.STORED, CHAIN, False, FAMILY, tier=Tier.HOST))
    route_family(core, 2)
    if device_full:
        store(core, "n0", list(range(900_000, 900_512)), family="filler")
    heartbeat_all(core, 1)
    forecasts.counts = {FAMILY: 1.0}
    return core


def test_a_prefetch_takes_a_promotion_off_the_critical_path_when_it_evicts_nothing():
    """n0 keeps the chain in its host tier only: a request there first
    promotes 128 blocks (268 MB at 400 Gbit/s + 0.05 ms = 5.4 ms). Promoting
    them ahead of the forecast request saves exactly that."""
    core = _host_only_holder(device_full=False)
    orders = core.tick()
    assert [(o.spec.action, o.spec.source, o.spec.target, o.spec.tier) for o in orders] == [
        (ActionKind.PREFETCH, "n0", "n0", Tier.DEVICE)]
    assert orders[0].spec.block_hashes == CHAIN
    assert orders[0].spec.expected_benefit_ms == pytest.approx(128 * 2 * 2**20 * 8 / 400e9 * 1e3 + 0.05)


def test_a_prefetch_that_demotes_blocks_wanted_again_costs_more_than_it_saves():
    """A full device tier demotes 128 blocks to make room; each is wanted
    again (p = 1) and then costs its own promotion (0.09 ms): 11.8 ms > 5.4 ms."""
    assert _host_only_holder(device_full=True).tick() == []


@pytest.mark.parametrize("kind, count, orders", [
    (ForecastKind.RETURN, 0.04, 0),  # below min_return_probability (0.05): not priced
    (ForecastKind.RETURN, 0.5, 1),  # a likely return behind a swamped holder: one replica
    (ForecastKind.BURST, 0.5, 0),  # a count model's half request is below min_expected_requests (1.0)
    (ForecastKind.BURST, 1.0, 1),
])
def test_return_forecasts_and_burst_counts_have_their_own_floors(kind, count, orders):
    """...and each order names the forecast it was bought for."""
    core = _one_request_behind_a_swamped_holder(0.0, fill_targets=False)
    forecasts = core.context.forecasts
    forecasts.counts, forecasts.kinds = {FAMILY: count}, {FAMILY: kind}
    assert [o.spec.forecast for o in core.tick()] == [kind.value] * orders


_TWO_EQUAL_HOLDERS = """
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.holder_index import HolderEventKind
from tests.support.scheduler_scenarios import CHAIN, FAMILY, BS, ScriptedForecasts, heartbeat_all, make_core, store
forecasts = ScriptedForecasts()
core, clock = make_core(6, "predictive", forecasts, planner={"horizon_s": 1.0, "plan_every_s": 0.0,
                                                              "queue_externality": True})
store(core, "n0", CHAIN)
store(core, "n1", CHAIN)  # two holders of the same prefix, equally idle: the walk's tie
other = list(range(90_000, 90_064))
store(core, "n1", other, family="other")
for i in range(40):  # routes to n1 only: the externality prices n0 and n1 apart
    core.route(f"o-{i}", other + [95_000 + i], (len(other) + 1) * BS, "other")
for i in range(2):
    core.route(f"d-{i}", CHAIN + [97_000 + i], (len(CHAIN) + 1) * BS + 3, FAMILY)
heartbeat_all(core, 6)
forecasts.counts = {FAMILY: 300.0}
print(sorted((o.spec.action.value, o.spec.source, o.spec.target, repr(o.spec.expected_benefit_ms))
             for o in core.tick()))
"""


def test_the_plan_does_not_depend_on_string_hashing_with_the_queue_externality_on():
    """Two holders of one prefix tie in the planner's walk, which gives a tie
    to the option listed first; the holder index lists equal holders in a
    set's order, which follows str hashing and so differs per process
    (PYTHONHASHSEED). With the queue externality on, the node that takes the
    work is priced (its routes per second), so the plan moved between runs
    of the same simulation (docs/journal/planner.md, 2026-12-06). Holders are
    walked in node order: the same orders, to the digit, whatever the seed."""
    import os
    import subprocess
    import sys

    plans = {subprocess.run([sys.executable, "-c", _TWO_EQUAL_HOLDERS], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip() for seed in range(8)}
    assert len(plans) == 1 and plans != {"[]"}
