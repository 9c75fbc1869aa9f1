"""The connector's worker on CUDA pages: saves and loads through the
kvstore's pool and over gRPC (in-process fakes of the kvstore), whole and
layer by layer, bit for bit. Needs torch with a CUDA device; skipped without
one (kernels/run_gpu_checks.sh runs it where one is lent)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from speckv.services.engine.vllm_connector.counters import Counters
from speckv.services.engine.vllm_connector.identity import CUDA_PAGE_LAYOUT
from speckv.services.engine.vllm_connector.plan import LoadSpec, SaveSpec, StepPlan
from speckv.services.engine.vllm_connector.worker_side import WorkerSide
from tests.support.connector_fakes import LAYOUT, CoreShared, FakeStore

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA device")]


def cuda_caches(seed: int | None):
    shape = (8, 2, 32, 32)  # connector_fakes.LAYOUT: 2 layers, 2 KV heads, 32-token blocks, head_dim 16
    if seed is not None:
        torch.manual_seed(seed)
    return {f"model.layers.{i}.self_attn.attn": (torch.randn(shape) if seed is not None else torch.zeros(shape)).cuda()
            for i in (1, 0)}


@pytest.mark.parametrize("shared_memory", [True, False], ids=["pool", "grpc"])
@pytest.mark.parametrize("by_layer", [True, False], ids=["by-layer", "whole"])
def test_the_worker_saves_and_loads_cuda_pages_bit_for_bit(shared_memory, by_layer):
    layout = replace(LAYOUT, page_layout=CUDA_PAGE_LAYOUT)
    store, shared = FakeStore(), (CoreShared() if shared_memory else None)
    saver = WorkerSide(layout, store, Counters(), shared)
    source = cuda_caches(seed=5)
    saver.register_kv_caches(source)
    saver.save(StepPlan(saves=[SaveSpec("r", (5, 2), (11, 12), (None, 11), "11")]))
    saver.flush()
    saver.shutdown()
    loader = WorkerSide(layout, store, Counters(), shared, load_by_layer=by_layer)
    target = cuda_caches(seed=None)
    loader.register_kv_caches(target)
    loader.load(StepPlan(loads=[LoadSpec("r", (0, 7), (11, 12))]))
    loader.finish_loads()
    torch.cuda.synchronize()
    for name in source:
        assert torch.equal(target[name][0], source[name][5]) and torch.equal(target[name][7], source[name][2])
    assert loader.take_load_errors() == set()
    loader.shutdown()
