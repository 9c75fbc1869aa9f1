import time
from dataclasses import replace

import pytest
import torch

from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.plan import LoadSpec, SaveSpec, StepPlan
from speckv.services.engine.vllm_connector.port import PullTarget
from speckv.services.engine.vllm_connector.worker_side import WorkerSide, layer_order
from tests.support.connector_fakes import LAYOUT, CoreShared, FakePeer, FakeStore

BY_LAYER = pytest.mark.parametrize("by_layer", [True, False], ids=["by-layer", "whole"])


def saved_block(seed: int, block_id: int):
    """A shared-memory kvstore holding block_id, saved from page 1 of caches(seed); and those caches."""
    shared = CoreShared()
    saver = WorkerSide(LAYOUT, FakeStore(), Counters(), shared)
    source = caches(seed=seed)
    saver.register_kv_caches(source)
    saver.save(StepPlan(saves=[SaveSpec("r", (1,), (block_id,), (None,), str(block_id))]))
    saver.flush()
    saver.shutdown()
    return shared, source


def caches(seed: int | None):
    make = (lambda: torch.randn(8, 2, 32, 32)) if seed is not None else (lambda: torch.zeros(8, 2, 32, 32))
    if seed is not None:
        torch.manual_seed(seed)
    return {f"model.layers.{i}.self_attn.attn": make() for i in (1, 0)}


def test_layers_are_ordered_by_their_index():
    assert layer_order(["m.layers.10.a", "m.layers.2.a", "m.layers.0.a"]) == ["m.layers.0.a", "m.layers.2.a",
                                                                                "m.layers.10.a"]


@BY_LAYER
def test_a_saved_block_loads_back_into_other_pages_bit_for_bit(by_layer):
    store, counters = FakeStore(), Counters()
    saver = WorkerSide(LAYOUT, store, counters)
    source = caches(seed=1)
    saver.register_kv_caches(source)
    saver.save(StepPlan(saves=[SaveSpec("r", (5, 2), (11, 12), (None, 11), "11")]))
    saver.shutdown()
    assert sorted(store.blocks) == [11, 12] and counters.blocks_saved == 0  # the fake counts nothing itself
    loader = WorkerSide(LAYOUT, store, Counters(), load_by_layer=by_layer)
    target = caches(seed=None)
    loader.register_kv_caches(target)
    loader.load(StepPlan(loads=[LoadSpec("r", (0, 7), (11, 12))]))
    loader.finish_loads()  # the step's forward is over
    for name in source:
        assert torch.equal(target[name][0], source[name][5]) and torch.equal(target[name][7], source[name][2])
    assert loader.take_load_errors() == set()
    loader.shutdown()


@BY_LAYER
def test_a_failed_load_reports_its_pages_once(by_layer):
    store = FakeStore()
    store.blocks[11] = b"\0" * (2 * 2 * 32 * 2 * 16 * 4)
    store.broken.add(11)
    worker = WorkerSide(LAYOUT, store, Counters(), load_by_layer=by_layer)
    worker.register_kv_caches(caches(seed=None))
    worker.load(StepPlan(loads=[LoadSpec("r", (3,), (11,))]))
    worker.finish_loads()  # the step's forward is over
    assert worker.take_load_errors() == {3}
    assert worker.take_load_errors() == set()
    worker.shutdown()


def test_caches_of_another_layer_count_are_refused():
    worker = WorkerSide(replace(LAYOUT, num_layers=3), FakeStore(), Counters())
    try:
        worker.register_kv_caches(caches(seed=1))
    except ValueError as error:
        assert "layers" in str(error)
    else:
        raise AssertionError("accepted 2 layers for a 3-layer layout")
    finally:
        worker.shutdown()


def canonical(worker_caches, pages):
    from speckv.services.engine.vllm_connector.pages import gather_blocks, page_arrays, page_views
    names = layer_order(list(worker_caches))
    views = page_views([worker_caches[n] for n in names], LAYOUT.num_kv_heads, LAYOUT.block_size, LAYOUT.head_dim)
    return gather_blocks(page_arrays(views), pages)


@BY_LAYER
def test_shared_memory_saves_land_in_the_kvstore_pool_and_load_back_bit_for_bit(by_layer):
    shared, counters = CoreShared(), Counters()
    saver = WorkerSide(LAYOUT, FakeStore(), counters, shared)
    source = caches(seed=3)
    saver.register_kv_caches(source)
    saver.save(StepPlan(saves=[SaveSpec("r", (5, 2, 6), (11, 12, 13), (None, 11, 12), "11")]))
    saver.flush()
    stored = [bytes(b) for _, b in shared.store.get_blocks([11, 12, 13])]
    expected = canonical(source, [5, 2, 6])
    assert stored == [expected[i].tobytes() for i in range(3)]
    loader = WorkerSide(LAYOUT, FakeStore(), Counters(), shared, load_by_layer=by_layer)
    target = caches(seed=None)
    loader.register_kv_caches(target)
    loader.load(StepPlan(loads=[LoadSpec("r", (0, 1, 7), (11, 12, 13))]))
    loader.finish_loads()  # the step's forward is over
    loader.flush()
    for name in source:
        for s, t in ((5, 0), (2, 1), (6, 7)):
            assert torch.equal(target[name][t], source[name][s])
    assert loader.take_load_errors() == set() and shared.released == 1
    assert shared.store.stats().pinned_pages == 0
    saver.shutdown()
    loader.shutdown()


def test_shared_memory_save_skips_blocks_the_kvstore_holds():
    shared = CoreShared()
    worker = WorkerSide(LAYOUT, FakeStore(), Counters(), shared)
    worker.register_kv_caches(caches(seed=4))
    worker.save(StepPlan(saves=[SaveSpec("r", (1,), (21,), (None,), "21")]))
    worker.flush()
    first = [bytes(b) for _, b in shared.store.get_blocks([21])]
    worker.register_kv_caches(caches(seed=5))  # other bytes under the same id: the stored block stays
    worker.save(StepPlan(saves=[SaveSpec("r", (1, 2), (21, 22), (None, 21), "21")]))
    worker.flush()
    assert [bytes(b) for _, b in shared.store.get_blocks([21])] == first
    assert shared.store.lookup([21, 22]).prefix_blocks == 2
    worker.shutdown()


@BY_LAYER
def test_shared_memory_load_of_a_missing_block_or_past_its_lease_is_a_load_error(by_layer):
    shared = CoreShared(lease_s=-1.0)  # every lease has lapsed by the time the copy ends
    worker = WorkerSide(LAYOUT, FakeStore(), Counters(), shared, load_by_layer=by_layer)
    worker.register_kv_caches(caches(seed=6))
    worker.save(StepPlan(saves=[SaveSpec("r", (1,), (31,), (None,), "31")]))
    worker.flush()
    worker.load(StepPlan(loads=[LoadSpec("r", (4,), (31,)), LoadSpec("q", (6,), (99,))]))
    worker.finish_loads()  # the step's forward is over
    assert worker.take_load_errors() == {4, 6}
    worker.flush()
    assert shared.store.stats().pinned_pages == 0  # the lapsed one's pins were still released
    worker.shutdown()


@BY_LAYER
def test_a_load_pinned_at_lookup_copies_without_a_call_and_releases_the_lease(by_layer):
    shared = CoreShared()
    saver = WorkerSide(LAYOUT, FakeStore(), Counters(), shared)
    source = caches(seed=8)
    saver.register_kv_caches(source)
    saver.save(StepPlan(saves=[SaveSpec("r", (1, 2, 3), (41, 42, 43), (None, 41, 42), "41")]))
    saver.flush()
    lease = shared.map_prefix([41, 42, 43, 44])
    assert lease.ids == (41, 42, 43)
    counters = Counters()
    # the port releases through the same core
    loader = WorkerSide(LAYOUT, shared, counters, shared, load_by_layer=by_layer)
    target = caches(seed=None)
    loader.register_kv_caches(target)
    loader.load(StepPlan(loads=[LoadSpec("r", (6, 7), (42, 43), lease, 1)]))
    loader.finish_loads()  # the step's forward is over
    loader.flush()
    for name in source:
        assert torch.equal(target[name][6], source[name][2]) and torch.equal(target[name][7], source[name][3])
    assert counters.blocks_loaded_shared == 2 and shared.store.stats().pinned_pages == 0
    saver.shutdown()
    loader.shutdown()


@BY_LAYER
def test_a_lease_of_other_blocks_falls_back_to_grpc_and_is_still_released(by_layer):
    shared, _ = saved_block(seed=9, block_id=51)
    lease = shared.map_prefix([51])
    store = FakeStore()
    store.blocks[52] = [bytes(b) for _, b in shared.store.get_blocks([51])][0]
    loader = WorkerSide(LAYOUT, store, Counters(), shared, load_by_layer=by_layer)
    loader.register_kv_caches(caches(seed=None))
    loader.load(StepPlan(loads=[LoadSpec("r", (3,), (52,), lease, 0)]))  # the lease names 51, the load 52
    errors = loader.take_load_errors()  # waits for the step's loads (by layer: on their thread)
    loader.flush()  # and then for the release they queued
    assert errors == set() and store.released == [lease]
    loader.shutdown()


@BY_LAYER
def test_a_lease_that_lapsed_before_its_load_ran_reads_over_grpc_not_the_pages(by_layer):
    shared, source = saved_block(seed=9, block_id=51)
    lease = replace(shared.map_prefix([51]), until=time.monotonic() - 1.0)  # queued past its pins
    store, counters = FakeStore(), Counters()
    store.blocks[51] = [bytes(b) for _, b in shared.store.get_blocks([51])][0]
    loader = WorkerSide(LAYOUT, store, counters, shared, load_by_layer=by_layer)
    target = caches(seed=None)
    loader.register_kv_caches(target)
    loader.load(StepPlan(loads=[LoadSpec("r", (3,), (51,), lease, 0)]))
    errors = loader.take_load_errors()
    loader.flush()
    assert errors == set() and store.released == [lease] and counters.load_failures == 0
    for name in source:
        assert torch.equal(target[name][3], source[name][1])
    loader.shutdown()


@BY_LAYER
def test_a_pull_copies_into_the_nodes_kvstore_then_loads_from_it_bit_for_bit(by_layer):
    store, counters = FakeStore(), Counters()
    peer = FakePeer({"n1": store})
    saver = WorkerSide(LAYOUT, peer, Counters())
    source = caches(seed=3)
    saver.register_kv_caches(source)
    saver.save(StepPlan(saves=[SaveSpec("r", (4, 6), (21, 22), (None, 21), "21")]))
    saver.shutdown()
    loader = WorkerSide(LAYOUT, store, counters, peers={"n2": peer}, pull_target=PullTarget("n1", "h:1"),
                        load_by_layer=by_layer)
    target = caches(seed=None)
    loader.register_kv_caches(target)
    loader.load(StepPlan(loads=[LoadSpec("r", (1, 2), (21, 22), source="n2", family="21")]))
    loader.finish_loads()  # the step's forward is over
    assert peer.orders[0][:4] == ("n1", "h:1", (21, 22), "21")
    assert sorted(store.blocks) == [21, 22]  # the pull left them on this node
    for name in source:
        assert torch.equal(target[name][1], source[name][4]) and torch.equal(target[name][2], source[name][6])
    assert loader.take_load_errors() == set() and counters.blocks_pulled == 2
    peer.refuse = True
    loader.load(StepPlan(loads=[LoadSpec("r2", (3,), (23,), source="n2", family="23")]))
    loader.finish_loads()  # the step's forward is over
    assert loader.take_load_errors() == {3} and counters.pull_failures == 1
    loader.load(StepPlan(loads=[LoadSpec("r3", (5,), (21,), source="n9", family="21")]))  # a peer it lacks
    assert loader.take_load_errors() == {5} and counters.pull_failures == 2
    loader.shutdown()


def test_waiting_for_a_layer_by_its_vllm_name_finds_its_pages_loaded():
    shared = CoreShared()
    saver = WorkerSide(LAYOUT, FakeStore(), Counters(), shared)
    source = caches(seed=12)
    saver.register_kv_caches(source)
    saver.save(StepPlan(saves=[SaveSpec("r", (3, 4), (61, 62), (None, 61), "61")]))
    saver.flush()
    loader = WorkerSide(LAYOUT, FakeStore(), Counters(), shared, load_by_layer=True)
    target = caches(seed=None)
    loader.register_kv_caches(target)
    loader.load(StepPlan(loads=[LoadSpec("r", (5, 6), (61, 62))]))
    loader.wait_for_layer("model.layers.0.self_attn.attn")
    first = "model.layers.0.self_attn.attn"
    assert torch.equal(target[first][5], source[first][3]) and torch.equal(target[first][6], source[first][4])
    loader.wait_for_layer("not.a.layer")  # a name it never registered waits for every layer
    assert all(torch.equal(target[name][5], source[name][3]) for name in source)
    assert loader.take_load_errors() == set()
    saver.shutdown()
    loader.shutdown()


def test_a_node_id_the_kvstore_could_not_say_at_start_is_asked_again_at_a_pull():
    store, counters = FakeStore(), Counters()
    peer = FakePeer({"n1": store})
    peer.blocks[21] = bytes(LAYOUT.num_layers * 2 * LAYOUT.block_size * LAYOUT.num_kv_heads * LAYOUT.head_dim * 4)
    answers = iter([None, PullTarget("n1", "h:1")])  # the kvstore was not up when the engine started
    loader = WorkerSide(LAYOUT, store, counters, peers={"n2": peer}, pull_target=lambda: next(answers))
    loader.register_kv_caches(caches(seed=None))
    loader.load(StepPlan(loads=[LoadSpec("r", (1,), (21,), source="n2", family="21")]))
    assert loader.take_load_errors() == {1} and counters.pull_failures == 1  # not known yet: recomputed
    loader._loader._resolve_after = 0.0  # the retry interval has passed
    loader.load(StepPlan(loads=[LoadSpec("r2", (2,), (21,), source="n2", family="21")]))
    assert loader.take_load_errors() == set() and counters.blocks_pulled == 1
    loader.shutdown()
