from dataclasses import replace

import torch

from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.plan import LoadSpec, SaveSpec, StepPlan
from speckv.services.engine.vllm_connector.worker_side import WorkerSide, layer_order
from tests.support.connector_fakes import LAYOUT, FakeStore

def caches(seed: int | None):
    make = (lambda: torch.randn(8, 2, 32, 32)) if seed is not None else (lambda: torch.zeros(8, 2, 32, 32))
    if seed is not None:
        torch.manual_seed(seed)
    return {f"model.layers.{i}.self_attn.attn": make() for i in (1, 0)}


def test_layers_are_ordered_by_their_index():
    assert layer_order(["m.layers.10.a", "m.layers.2.a", "m.layers.0.a"]) == ["m.layers.0.a", "m.layers.2.a",
                                                                                "m.layers.10.a"]


def test_a_saved_block_loads_back_into_other_pages_bit_for_bit():
    store, counters = FakeStore(), Counters()
    saver = WorkerSide(LAYOUT, store, counters)
    source = caches(seed=1)
    saver.register_kv_caches(source)
    saver.save(StepPlan(saves=[SaveSpec("r", (5, 2), (11, 12), (None, 11), "11")]))
    saver.shutdown()
    assert sorted(store.blocks) == [11, 12] and counters.blocks_saved == 0  # the fake counts nothing itself
    loader = WorkerSide(LAYOUT, store, Counters())
    target = caches(seed=None)
    loader.register_kv_caches(target)
    loader.load(StepPlan(loads=[LoadSpec("r", (0, 7), (11, 12))]))
    for name in source:
        assert torch.equal(target[name][0], source[name][5]) and torch.equal(target[name][7], source[name][2])
    assert loader.take_load_errors() == set()
    loader.shutdown()


def test_a_failed_load_reports_its_pages_once():
    store = FakeStore()
    store.blocks[11] = b"\0" * (2 * 2 * 32 * 2 * 16 * 4)
    store.broken.add(11)
    worker = WorkerSide(LAYOUT, store, Counters())
    worker.register_kv_caches(caches(seed=None))
    worker.load(StepPlan(loads=[LoadSpec("r", (3,), (11,))]))
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
