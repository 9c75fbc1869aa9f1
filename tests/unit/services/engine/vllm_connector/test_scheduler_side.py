"""SchedulerSide against vLLM-shaped stand-ins (the fields vLLM 0.32's
Request, KVCacheBlocks and SchedulerOutput carry) and a dict kvstore."""
from types import SimpleNamespace

from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.identity import block_ids
from speckv.services.engine.vllm_connector.scheduler_side import SchedulerSide, pull_source
from tests.support.connector_fakes import LAYOUT, FakePeer, FakeStore

HASHES = [bytes([i]) * 32 for i in range(1, 6)]  # 5 full blocks of 32 tokens


def request(prompt_tokens: int = 5 * 32 + 3):
    return SimpleNamespace(request_id="r", num_prompt_tokens=prompt_tokens, block_hashes=list(HASHES))


def step(new=(), cached_ids=(), cached_pages=(), cached_computed=(), scheduled=None):
    cached = SimpleNamespace(req_ids=list(cached_ids), new_block_ids=list(cached_pages), resumed_req_ids=set(),
                             num_computed_tokens=list(cached_computed))
    return SimpleNamespace(scheduled_new_reqs=list(new), scheduled_cached_reqs=cached,
                           num_scheduled_tokens=scheduled or {})


def make(held_blocks: int):
    store, counters = FakeStore(), Counters()
    ids = block_ids(LAYOUT.digest(), HASHES)
    for i in ids[:held_blocks]:
        store.blocks[i] = b""
    return SchedulerSide(LAYOUT, store, counters), ids, counters


def test_it_offers_the_blocks_past_the_engines_hit_and_plans_their_load():
    side, ids, counters = make(held_blocks=4)
    req = request()
    assert side.get_num_new_matched_tokens(req, 32) == (3 * 32, False)  # blocks 1..3 past the engine's 1
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([10, 11, 12, 13, 14, 15],)), 96)
    new = SimpleNamespace(req_id="r", block_ids=([10, 11, 12, 13, 14, 15],), num_computed_tokens=128)
    plan = side.build_step(step(new=[new], scheduled={"r": 35}))
    assert [(l.page_ids, l.block_ids) for l in plan.loads] == [((11, 12, 13), tuple(ids[1:4]))]
    # the step computes tokens 128..163: block 4 is new, and the only one saved
    assert [(s.page_ids, s.block_ids, s.parents) for s in plan.saves] == [((14,), (ids[4],), (ids[3],))]
    assert counters.blocks_matched == 3


def test_a_prompt_never_loads_its_last_token():
    side, _, _ = make(held_blocks=5)
    assert side.get_num_new_matched_tokens(request(prompt_tokens=5 * 32), 0) == (4 * 32, False)


def test_one_lookup_per_request_and_nothing_when_the_store_holds_nothing():
    side, _, counters = make(held_blocks=0)
    req = request()
    assert side.get_num_new_matched_tokens(req, 0) == (0, False)
    assert side.get_num_new_matched_tokens(req, 0) == (0, False)
    side.request_finished(req)
    assert counters.blocks_matched == 0


def test_decode_blocks_are_saved_as_they_fill():
    side, ids, _ = make(held_blocks=0)
    req = request(prompt_tokens=3 * 32 + 5)
    req.block_hashes = list(HASHES[:3])
    side.get_num_new_matched_tokens(req, 0)
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4],)), 0)
    new = SimpleNamespace(req_id="r", block_ids=([1, 2, 3, 4],), num_computed_tokens=0)
    plan = side.build_step(step(new=[new], scheduled={"r": 3 * 32 + 5}))
    assert [s.block_ids for s in plan.saves] == [tuple(ids[:3])]
    req.block_hashes = list(HASHES[:4])  # the fourth block's tokens are all there now
    plan = side.build_step(step(cached_ids=["r"], cached_pages=[None], cached_computed=[4 * 32 - 1],
                                scheduled={"r": 1}))
    assert [(s.page_ids, s.block_ids) for s in plan.saves] == [((4,), (ids[3],))]


def test_a_resumed_request_loads_what_it_was_matched_again():
    side, ids, _ = make(held_blocks=4)
    req = request()
    side.get_num_new_matched_tokens(req, 0)
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4, 5, 6],)), 128)
    new = SimpleNamespace(req_id="r", block_ids=([1, 2, 3, 4, 5, 6],), num_computed_tokens=128)
    side.build_step(step(new=[new], scheduled={"r": 35}))
    # preempted, back to waiting, matched and allocated again, then scheduled as a resumed cached request
    side.get_num_new_matched_tokens(req, 0)
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([9, 8, 7, 6, 5, 4],)), 128)
    cached = step(cached_ids=["r"], cached_pages=[([9, 8, 7, 6, 5, 4],)], cached_computed=[128], scheduled={"r": 35})
    cached.scheduled_cached_reqs.resumed_req_ids = {"r"}
    plan = side.build_step(cached)
    assert [(l.page_ids, l.block_ids) for l in plan.loads] == [((9, 8, 7, 6), tuple(ids[:4]))]


def pinned(held_blocks: int):
    """A SchedulerSide over a real core in shared memory (CoreShared): the
    lookup pins what it finds."""
    from speckv.services.engine.vllm_connector.worker_side import WorkerSide
    from tests.support.connector_fakes import CoreShared, FakeStore

    shared = CoreShared()
    ids = block_ids(LAYOUT.digest(), HASHES)
    import torch
    writer = WorkerSide(LAYOUT, FakeStore(), Counters(), shared)
    writer.register_kv_caches({f"model.layers.{i}.attn": torch.randn(8, 2, 32, 32) for i in range(2)})
    from speckv.services.engine.vllm_connector.plan import SaveSpec, StepPlan
    writer.save(StepPlan(saves=[SaveSpec("w", tuple(range(held_blocks)), tuple(ids[:held_blocks]),
                                         (None, *ids[:held_blocks - 1]), str(ids[0]))]))
    writer.shutdown()
    return SchedulerSide(LAYOUT, shared, Counters()), ids, shared


def test_a_lookup_on_shared_pages_pins_them_and_its_load_carries_the_lease():
    side, ids, shared = pinned(held_blocks=4)
    req = request()
    assert side.get_num_new_matched_tokens(req, 32) == (3 * 32, False)
    assert shared.store.stats().pinned_pages == 4  # the whole prefix found, pinned until a load takes it
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([10, 11, 12, 13, 14, 15],)), 96)
    new = SimpleNamespace(req_id="r", block_ids=([10, 11, 12, 13, 14, 15],), num_computed_tokens=128)
    (load,) = side.build_step(step(new=[new], scheduled={"r": 35})).loads
    assert load.lease is not None and load.lease_start == 1
    assert load.lease.ids[1:4] == load.block_ids == tuple(ids[1:4])
    assert shared.store.stats().pinned_pages == 4  # still held: the worker releases it after its copy


def test_a_lookup_no_load_takes_is_released():
    side, _, shared = pinned(held_blocks=3)
    req = request()
    side.get_num_new_matched_tokens(req, 0)
    assert shared.store.stats().pinned_pages == 3
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4, 5, 6],)), 0)
    assert shared.store.stats().pinned_pages == 0
    side.get_num_new_matched_tokens(req, 0)
    side.request_finished(req)
    assert shared.store.stats().pinned_pages == 0


def pulling(held_here: int, held_there: int, names: str = "n2"):
    side, ids, counters = make(held_blocks=held_here)
    peer = FakePeer({})
    for i in ids[:held_there]:
        peer.blocks[i] = b""
    side = SchedulerSide(LAYOUT, side._client, counters, {"n2": peer})
    req = request()
    req.kv_transfer_params = {"speckv": {"pull_from": names}}
    return side, req, ids, counters


def test_a_request_naming_a_peer_that_holds_more_loads_the_rest_from_it():
    side, req, ids, counters = pulling(held_here=2, held_there=4)
    assert side.get_num_new_matched_tokens(req, 32) == (3 * 32, False)  # blocks 1..3: two here, then 4 there
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([10, 11, 12, 13, 14, 15],)), 96)
    new = SimpleNamespace(req_id="r", block_ids=([10, 11, 12, 13, 14, 15],), num_computed_tokens=128)
    plan = side.build_step(step(new=[new], scheduled={"r": 35}))
    assert [(l.page_ids, l.block_ids, l.source) for l in plan.loads] == [
        ((11,), (ids[1],), ""), ((12, 13), tuple(ids[2:4]), "n2")]
    assert plan.loads[1].family == str(ids[0])
    assert [s.block_ids for s in plan.saves] == [(ids[4],)]  # pulled blocks land in the kvstore by the pull
    assert counters.blocks_matched == 3


def test_a_peer_holding_no_more_than_the_node_is_not_pulled_from():
    side, req, ids, _ = pulling(held_here=3, held_there=3)
    assert side.get_num_new_matched_tokens(req, 0) == (3 * 32, False)
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4, 5, 6],)), 96)
    new = SimpleNamespace(req_id="r", block_ids=([1, 2, 3, 4, 5, 6],), num_computed_tokens=96)
    assert [l.source for l in side.build_step(step(new=[new], scheduled={"r": 67})).loads] == [""]


def test_a_peer_the_connector_does_not_know_is_refused_and_counted():
    side, req, _, counters = pulling(held_here=1, held_there=4, names="elsewhere:50051")
    assert side.get_num_new_matched_tokens(req, 0) == (32, False)
    assert counters.pulls_refused == 1


def test_malformed_transfer_params_pull_nothing():
    for params in (None, "n2", {"speckv": "n2"}, {"speckv": {"pull_from": 7}}, {"other": {"pull_from": "n2"}}):
        assert pull_source(params) == ""
    assert pull_source({"speckv": {"pull_from": "n2"}}) == "n2"


def test_async_loads_go_out_with_the_next_step_and_hold_the_pages_until_reported():
    side, ids, counters = make(held_blocks=4)
    side = SchedulerSide(LAYOUT, side._client, counters, load_async=True)
    req = request()
    assert side.get_num_new_matched_tokens(req, 0) == (4 * 32, True)
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4, 5, 6],)), 128)
    plan = side.build_step(step())  # the request waits, unscheduled: its load goes out anyway
    assert [(l.page_ids, l.block_ids) for l in plan.async_loads] == [((1, 2, 3, 4), tuple(ids[:4]))]
    assert plan.loads == [] and side.build_step(step()).async_loads == []
    assert side.request_finished(req) is True  # ended while loading: vLLM keeps its pages
    side.loads_ended({"r"}, {"r"})  # and its load then failed
    assert side.request_finished(req) is False
    assert side._load_failed == set()  # nothing kept of a request that has ended


def test_a_request_whose_async_load_failed_is_never_offered_a_load_again():
    side, _, counters = make(held_blocks=4)
    side = SchedulerSide(LAYOUT, side._client, counters, load_async=True)
    req = request()
    side.get_num_new_matched_tokens(req, 0)
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4, 5, 6],)), 128)
    side.build_step(step())
    side.loads_ended({"r"}, {"r"})
    assert side.get_num_new_matched_tokens(req, 0) == (0, False)  # recomputed from its start
    assert counters.async_load_failures == 1


def test_a_lookup_no_load_used_is_not_reused_when_the_request_is_asked_again():
    # Nothing to load at allocation (the engine's own hit covered what the kvstore held), then preempted: when
    # vLLM asks again the kvstore holds more, and the answer comes from a new lookup, not the first one.
    side, ids, _ = make(held_blocks=2)
    req = request()
    assert side.get_num_new_matched_tokens(req, 3 * 32) == (0, False)
    side.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([1, 2, 3, 4, 5, 6],)), 0)
    for i in ids[2:4]:
        side._client.blocks[i] = b""
    assert side.get_num_new_matched_tokens(req, 0) == (4 * 32, False)
