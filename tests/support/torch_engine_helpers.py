"""Helpers of the torch engine tests: a tiny model, prompts, and real
kvstore servers holding the model's (custom, non-preset) KV geometry."""
from __future__ import annotations

import contextlib
from typing import Iterator

import grpc
import numpy as np

from speckv.loadgen.engines.torch_engine import TorchEngine, TorchJob, TorchLimits
from speckv.loadgen.engines.torch_kv import BlockStore, CoreBlockStore
from speckv.loadgen.engines.torch_model import ModelSpec, TinyGPT
from speckv.services.common.clock import ManualClock
from speckv.services.common.rpc.server import ServiceServer
from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.kvstore.config import KVStoreConfig
from speckv.services.kvstore.server import build_server
from speckv.services.kvstore.store import KVStoreCore

SPEC = ModelSpec(vocab_size=512, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2, max_positions=1024, seed=7)
BLOCK = 16
GEOMETRY = SPEC.kv_geometry(BLOCK)
TIMEOUT = 10.0
_MODEL: list[TinyGPT] = []


def model() -> TinyGPT:
    """One shared instance (building it is the slow part; it holds no state)."""
    if not _MODEL:
        _MODEL.append(TinyGPT(SPEC))
    return _MODEL[0]


def prompt(seed: int, length: int, prefix: tuple[int, ...] = ()) -> tuple[int, ...]:
    """`prefix` followed by seeded random tokens, `length` in all."""
    rng = np.random.default_rng(seed)
    return prefix + tuple(rng.integers(0, SPEC.vocab_size, length - len(prefix)).tolist())


def job(request_id: str, tokens: tuple[int, ...], output_tokens: int = 8, **fields) -> TorchJob:
    return TorchJob(request_id, len(tokens), output_tokens, tokens=tokens, **fields)


def core_store(node_id: str = "n", num_pages: int = 256) -> tuple[KVStoreCore, CoreBlockStore]:
    core = KVStoreCore(node_id, GEOMETRY, num_pages, ManualClock(1000.0))
    return core, CoreBlockStore(core)


def engine(store: BlockStore, node_id: str = "n", limits: TorchLimits = TorchLimits(), **kwargs) -> TorchEngine:
    return TorchEngine(node_id, model(), store, BLOCK, limits, **kwargs)


def run(engine_: TorchEngine, *jobs: TorchJob) -> list:
    """Submits the jobs at t=0 and runs the engine until it is idle; its events."""
    for j in jobs:
        engine_.submit(j, 0.0)
    events = engine_.advance(float("inf"))
    assert engine_.next_event_s() is None
    return events


def model_kvstore_config(node_id: str, **overrides) -> KVStoreConfig:
    """A kvstore config whose geometry is the model's (preset tiny, overridden)."""
    return KVStoreConfig(node_id=node_id, device_pages=256, geometry="tiny", num_layers=GEOMETRY.num_layers,
                         num_kv_heads=GEOMETRY.num_kv_heads, head_dim=GEOMETRY.head_dim, dtype=GEOMETRY.dtype,
                         block_size=GEOMETRY.block_size, **overrides)


@contextlib.contextmanager
def model_kvstore(node_id: str, **overrides) -> Iterator[tuple[ServiceServer, grpc.Channel]]:
    """A real kvstore server on 127.0.0.1 holding GEOMETRY, and a channel to it."""
    config = model_kvstore_config(node_id, **overrides)
    assert config.kv_geometry().bytes_per_block == GEOMETRY.bytes_per_block
    server = build_server(config, build_telemetry("kvstore", {})).start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield server, channel
    finally:
        channel.close()
        server.stop(grace_s=1.0)
