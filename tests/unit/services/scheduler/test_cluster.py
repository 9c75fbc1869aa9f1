import pytest

from speckv.services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from speckv.services.common.geometry import KVGeometry
from speckv.services.common.ids import NodeId
from speckv.services.common.node_sizes import NodeSizes
from speckv.services.scheduler.cluster import Cluster, LoadReport, NodeLoad, NodeStatus

GEO = KVGeometry(2, 2, 8, "float16", 4)


def make(timeout=5.0):
    return Cluster(node_timeout_s=timeout)


def test_node_goes_down_after_timeout_and_comes_back_only_by_registering_again():
    c = make()
    c.register(NodeId("a"), "h:1", NodeSizes(100), GEO, now=0.0)
    assert [n.node_id for n in c.live_nodes(5.0)] == ["a"]
    assert c.live_nodes(5.01) == []
    assert c.sweep(5.01) == ["a"]
    assert c.sweep(6.0) == []  # reported once
    assert c.get(NodeId("a")).status is NodeStatus.DOWN
    assert c.heartbeat(NodeId("a"), NodeLoad(queued_tokens=7), now=9.0) is False  # must register again
    assert c.live_nodes(9.0) == []
    node, again = c.register(NodeId("a"), "h:1", NodeSizes(100), GEO, now=9.5)
    assert again and node.status is NodeStatus.UP and node.generation == 2
    assert [n.node_id for n in c.live_nodes(9.5)] == ["a"]


def test_a_late_heartbeat_before_the_sweep_still_revives():
    c = make()
    c.register(NodeId("a"), "h:1", NodeSizes(100), GEO, now=0.0)
    assert c.live_nodes(6.0) == []
    assert c.heartbeat(NodeId("a"), NodeLoad(), now=6.0)  # not declared down yet
    assert [n.node_id for n in c.live_nodes(6.0)] == ["a"] and c.sweep(6.0) == []


def test_mark_down_takes_a_node_out_at_once():
    c = make()
    for n in ("a", "b"):
        c.register(NodeId(n), f"h:{n}", NodeSizes(100), GEO, now=0.0)
    assert c.mark_down(NodeId("a")) is True
    assert c.mark_down(NodeId("a")) is False and c.mark_down(NodeId("ghost")) is False
    assert [n.node_id for n in c.live_nodes(0.1)] == ["b"]
    assert c.least_loaded(2, 0.1) == ["b"]
    assert c.sweep(100.0) == ["b"]  # a's transition was already recorded
    assert c.heartbeat(NodeId("a"), NodeLoad(), now=0.2) is False


def test_unknown_heartbeat_is_not_known():
    assert make().heartbeat(NodeId("ghost"), NodeLoad(), now=0.0) is False


def test_reregistration_replaces_address_and_resets_load():
    c = make()
    first, again = c.register(NodeId("a"), "h:1", NodeSizes(100), GEO, now=0.0)
    assert not again
    c.heartbeat(NodeId("a"), NodeLoad(queued_tokens=50, free_pages=3), now=1.0)
    c.add_pending(NodeId("a"), 10)
    node, again = c.register(NodeId("a"), "h:2", NodeSizes(200), GEO, now=2.0)
    assert again and node.address == "h:2" and node.sizes.device_pages == 200
    assert node.queued_tokens == 0 and node.load.free_pages == 200
    assert node.generation > first.generation
    assert node.routes_total == 1  # history survives


def test_heartbeat_clears_pending_load():
    c = make()
    c.register(NodeId("a"), "h:1", NodeSizes(100), GEO, now=0.0)
    c.add_pending(NodeId("a"), 40)
    assert c.get(NodeId("a")).queued_tokens == 40
    c.heartbeat(NodeId("a"), NodeLoad(queued_tokens=45), now=0.5)
    node = c.get(NodeId("a"))
    assert node.queued_tokens == 45 and node.pending_requests == 0


@pytest.mark.parametrize("node_id,address,capacity,exc", [
    ("", "h:1", 10, InvalidArgument),
    ("a", "", 10, InvalidArgument),
    ("a", "nocolon", 10, InvalidArgument),
    ("a", "h:1", 0, InvalidArgument),
])
def test_register_rejects_malformed(node_id, address, capacity, exc):
    with pytest.raises(exc):
        make().register(NodeId(node_id), address, NodeSizes(capacity), GEO, now=0.0)


def test_register_rejects_bad_geometry_and_mixed_block_sizes():
    c = make()
    with pytest.raises(InvalidArgument, match="dtype"):
        c.register(NodeId("a"), "h:1", NodeSizes(10), KVGeometry(2, 2, 8, "int8", 4), now=0.0)
    c.register(NodeId("a"), "h:1", NodeSizes(10), GEO, now=0.0)
    with pytest.raises(FailedPrecondition, match="block_size"):
        c.register(NodeId("b"), "h:2", NodeSizes(10), KVGeometry(2, 2, 8, "float16", 8), now=0.0)
    # the only node may change its own block size
    c.register(NodeId("a"), "h:1", NodeSizes(10), KVGeometry(2, 2, 8, "float16", 8), now=0.0)


def test_get_unknown_is_not_found():
    with pytest.raises(NotFound):
        make().get(NodeId("x"))


def test_geometry_bytes():
    llama = KVGeometry(32, 8, 128, "bfloat16", 16)
    assert llama.bytes_per_token == 128 * 1024
    assert llama.bytes_per_block == 2 * 1024 * 1024


def test_a_free_pages_report_keeps_the_engine_queue_and_its_pending_work():
    """Two reporters per node: the kvstore's free pages must not wipe the
    engine's queue figures, nor forget work routed since the engine's report."""
    c = make()
    c.register(NodeId("a"), "h:1", NodeSizes(100), GEO, now=0.0)
    c.heartbeat(NodeId("a"), LoadReport(queued_tokens=500, running_tokens=70, running_requests=2,
                                        waiting_requests=3), now=0.1)
    c.add_pending(NodeId("a"), 40)
    c.heartbeat(NodeId("a"), LoadReport(free_pages=17), now=0.2)
    node = c.get(NodeId("a"))
    assert (node.load.queued_tokens, node.load.running_tokens, node.load.running_requests,
            node.load.waiting_requests, node.load.free_pages) == (500, 70, 2, 3, 17)
    assert node.queued_tokens == 540 and node.waiting_requests == 4
    assert node.last_heartbeat == 0.2
    c.heartbeat(NodeId("a"), LoadReport(queued_tokens=0, waiting_requests=0), now=0.3)
    node = c.get(NodeId("a"))
    assert node.queued_tokens == 0 and node.waiting_requests == 0 and node.load.free_pages == 17
    assert node.load.running_tokens == 70  # not in that report: as last reported


def test_a_full_node_load_still_replaces_every_figure():
    c = make()
    c.register(NodeId("a"), "h:1", NodeSizes(100), GEO, now=0.0)
    c.heartbeat(NodeId("a"), NodeLoad(queued_tokens=9, free_pages=5), now=0.1)
    c.heartbeat(NodeId("a"), NodeLoad(), now=0.2)
    assert c.get(NodeId("a")).load == NodeLoad()


def test_a_reported_prefill_estimate_replaces_the_token_linear_queue_and_adds_routed_work():
    c = Cluster(node_timeout_s=5.0, queue_cost=lambda tokens, waiting: 0.1 * tokens)
    c.register(NodeId("a"), "h:1", NodeSizes(100), GEO, now=0.0)
    c.heartbeat(NodeId("a"), LoadReport(queued_tokens=1000, waiting_requests=1), now=0.1)
    assert c.queue_ms(c.get(NodeId("a"))) == pytest.approx(100.0)  # token-linear: no estimate reported
    c.heartbeat(NodeId("a"), LoadReport(queued_tokens=1000, waiting_requests=1, queued_prefill_ms=2500.0), now=0.2)
    c.add_pending(NodeId("a"), 200, prefill_ms=30.0)
    assert c.queue_ms(c.get(NodeId("a"))) == pytest.approx(2530.0)
    c.heartbeat(NodeId("a"), LoadReport(free_pages=3), now=0.3)  # a kvstore's beat: queue figures stay
    assert c.queue_ms(c.get(NodeId("a"))) == pytest.approx(2530.0)
    c.heartbeat(NodeId("a"), LoadReport(queued_prefill_ms=0.0), now=0.4)  # counts what was routed
    assert c.queue_ms(c.get(NodeId("a"))) == pytest.approx(0.0)


def test_the_retained_count_is_kept_as_last_reported_and_forgotten_by_a_new_registration():
    c = make()
    c.register(NodeId("a"), "h:1", NodeSizes(100, 200, 100), GEO, now=0.0)
    assert c.get(NodeId("a")).load.retained_blocks is None  # not reported yet
    c.heartbeat(NodeId("a"), LoadReport(free_pages=17, retained_blocks=40), now=0.1)
    c.heartbeat(NodeId("a"), LoadReport(queued_tokens=5), now=0.2)  # the engine's beat leaves it
    node = c.get(NodeId("a"))
    assert (node.load.retained_blocks, node.retained_reported_at) == (40, 0.1)
    c.heartbeat(NodeId("a"), NodeLoad(free_pages=5, retained_blocks=7), now=0.3)  # a full report carries it
    assert (node.load.retained_blocks, node.retained_reported_at) == (7, 0.3)
    c.heartbeat(NodeId("a"), NodeLoad(free_pages=5), now=0.4)  # a full report without it: not known
    assert (node.load.retained_blocks, node.retained_reported_at) == (None, None)
    c.heartbeat(NodeId("a"), LoadReport(retained_blocks=40), now=0.5)
    c.register(NodeId("a"), "h:1", NodeSizes(100, 200, 100), GEO, now=0.6)
    node = c.get(NodeId("a"))  # a store that registered again says anew
    assert (node.load.retained_blocks, node.retained_reported_at) == (None, None)
    with pytest.raises(InvalidArgument, match="retained_blocks"):
        LoadReport(retained_blocks=-1)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_prefill_estimate_must_be_finite_and_non_negative(bad):
    with pytest.raises(InvalidArgument, match="queued_prefill_ms"):
        LoadReport(queued_prefill_ms=bad)


def test_requests_fetching_before_they_join_the_queue_are_counted_until_they_do():
    c = Cluster(node_timeout_s=5.0)
    c.register(NodeId("a"), "h:a", NodeSizes(100), GEO, now=0.0)
    c.add_pending(NodeId("a"), 10, 1.0, now=1.0, enters_in_ms=500.0)
    c.add_pending(NodeId("a"), 10, 1.0, now=1.0)  # no transfer: in the queue at once, not counted
    c.add_pending(NodeId("a"), 10, 1.0, now=1.2, enters_in_ms=100.0)
    node = c.get(NodeId("a"))
    assert c.entering_ms(node, 1.25) == pytest.approx((250.0, 50.0))
    assert c.entering_ms(node, 1.4) == pytest.approx((100.0,))
    assert c.entering_ms(node, 1.6) == () and node.entering == []
