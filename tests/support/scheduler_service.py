"""Fixtures for the scheduler service tests (imported explicitly)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import grpc

from speckv.services.common.clock import Clock
from speckv.services.common.rpc.telemetry import Telemetry, build_telemetry
from speckv.services.scheduler.adapters.config import SchedulerConfig
from speckv.services.scheduler.adapters.server import build_server
from speckv.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.support.waiting import TIMEOUT


@contextlib.contextmanager
def scheduler(clock: Clock | None = None, telemetry: Telemetry | None = None, **overrides) -> Iterator[tuple[object, scheduler_pb2_grpc.SchedulerStub]]:
    config = SchedulerConfig(**{"engine_profile": "tiny", "tick_s": 0.05, **overrides})
    server = build_server(config, telemetry or build_telemetry("scheduler", {}), clock=clock).start()
    channel = grpc.insecure_channel(server.address)
    try:
        yield server, scheduler_pb2_grpc.SchedulerStub(channel)
    finally:
        channel.close()
        server.stop(grace_s=1.0)


def register(stub, node_id: str, address: str, capacity: int = 256, block_size: int = 16):
    geometry = common_pb2.KVGeometry(num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32",
                                     block_size=block_size)
    return stub.RegisterNode(scheduler_pb2.RegisterNodeRequest(
        node_id=node_id, address=address, capacity_pages=capacity, geometry=geometry), timeout=TIMEOUT)

