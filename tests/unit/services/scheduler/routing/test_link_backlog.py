"""Routing with the links' backlog (services/scheduler/routing/link_backlog.py): a
pull is costed after the transfers the scheduler already put on the holder's
and the puller's links, so a burst stops queueing behind one holder's link
and recomputes once that is cheaper."""
from __future__ import annotations

import pytest

from speckv.services.common.engine_profile import LinkModel
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.cluster import NodeLoad
from speckv.services.scheduler.orders import OrderSpec
from speckv.services.scheduler.routing.link_backlog import LinkBacklog
from tests.support.scheduler_scenarios import BS, heartbeat_all, make_core, store

LINK = LinkModel(25.0, overhead_ms=1.0)
GIB = 2**30
A, B, C, D = (NodeId(x) for x in "abcd")


def test_an_idle_link_has_no_wait_and_a_booked_one_waits_for_its_transfer():
    backlog = LinkBacklog(LINK)
    assert backlog.wait_ms(A, 10.0) == 0.0
    end = backlog.add(A, B, GIB, 10.0)
    assert end == pytest.approx(10.0 + LINK.transfer_ms(GIB) / 1e3)
    for node in (A, B):
        assert backlog.wait_ms(node, 10.0) == pytest.approx(LINK.transfer_ms(GIB))
        assert backlog.wait_ms(node, 10.1) == pytest.approx(LINK.transfer_ms(GIB) - 100.0)
        assert backlog.wait_ms(node, end + 1.0) == 0.0
    assert backlog.wait_ms(C, 10.0) == 0.0


@pytest.mark.parametrize("second, starts_after_first", [((A, C), True), ((C, B), True), ((C, D), False)])
def test_transfers_sharing_an_end_queue_and_disjoint_ones_do_not(second, starts_after_first):
    backlog = LinkBacklog(LINK)
    first_end = backlog.add(A, B, GIB, 0.0)
    end = backlog.add(*second, GIB, 0.0)
    assert end == pytest.approx(2 * first_end if starts_after_first else first_end)


def test_prune_and_forget_drop_only_what_they_name():
    backlog = LinkBacklog(LINK)
    backlog.add(A, B, GIB, 0.0)
    backlog.add(C, D, 10 * GIB, 0.0)
    backlog.prune(1.0)  # A and B are done by then, C and D are not
    assert backlog.wait_ms(C, 1.0) > 0 and backlog.wait_ms(A, 0.0) == 0.0
    backlog.forget(C)
    assert backlog.wait_ms(C, 1.0) == 0.0 and backlog.wait_ms(D, 1.0) > 0


LONG = list(range(1, 2049))  # 2,048 blocks of 16 tokens: 32k tokens, 4 GiB of llama-3-8b KV


def busy_holder_core(policy: str = "none"):
    """n0 holds LONG but has 10 s of prefill queued: the others must pull or recompute."""
    core, clock = make_core(4, policy)
    heartbeat_all(core, 4)
    store(core, "n0", LONG, family="doc")
    core.heartbeat("n0", NodeLoad(free_pages=4096, queued_prefill_ms=10_000.0))
    return core, clock


def route(core, i: int):
    return core.route(f"r{i}", LONG + [900_000 + i], (len(LONG) + 1) * BS + 3, "doc")


def test_a_burst_pulls_once_per_link_slot_then_recomputes():
    core, clock = busy_holder_core()
    transfer = LINK.transfer_ms(len(LONG) * 2 * 2**20)
    first = route(core, 0)
    assert first.fetch_from == "n0" and first.fetch_ms == pytest.approx(transfer)
    second = route(core, 1)  # same instant: n0's link is taken for `transfer` ms
    assert second.node_id != "n0" and second.fetch_from is None and second.cached_blocks == 0
    clock.advance(transfer / 1e3)
    third = route(core, 2)  # the first pull is done: pulling is the cheapest again
    assert third.fetch_from == "n0" and third.fetch_ms == pytest.approx(transfer)


@pytest.mark.parametrize("order_blocks, still_pulls", [(256, True), (1024, False)])
def test_an_issued_order_holds_its_source_link_for_later_pulls(order_blocks, still_pulls):
    """A pull after an order from the same holder waits for the order's
    bytes: after 256 blocks (0.17 s) pulling still beats recomputing 32k
    tokens (1.78 s); after 1,024 blocks (0.69 s) it no longer does."""
    core, clock = busy_holder_core()
    core.submit_order(OrderSpec("doc", LONG[:order_blocks], NodeId("n0"), NodeId("n3"), 15_000, policy="manual"))
    decision = route(core, 0)
    if still_pulls:
        assert decision.fetch_from == "n0"
        assert decision.fetch_ms == pytest.approx(LINK.transfer_ms(order_blocks * 2 * 2**20)
                                                  + LINK.transfer_ms(len(LONG) * 2 * 2**20))
    else:
        assert decision.fetch_from is None and decision.cached_blocks == 0 and decision.node_id != "n0"


def test_a_re_registered_node_starts_with_an_idle_link():
    core, clock = busy_holder_core()
    assert route(core, 0).fetch_from == "n0"
    core.register_node("n0", "127.0.0.1:7000", NodeSizes(4096), None)
    heartbeat_all(core, 4)
    store(core, "n0", LONG, family="doc")
    core.heartbeat("n0", NodeLoad(free_pages=4096, queued_prefill_ms=10_000.0))
    assert route(core, 1).fetch_from == "n0"


def test_the_warm_start_history_books_pulls_in_the_past():
    """A request routed with an arrival long before now (the warm start)
    books its pull from then: it does not hold the link today."""
    core, clock = busy_holder_core()
    old = core.route("old", LONG + [999_999], (len(LONG) + 1) * BS + 3, "doc", arrival_time_s=clock.now() - 60.0)
    assert old.fetch_from == "n0"
    assert route(core, 0).fetch_from == "n0"
