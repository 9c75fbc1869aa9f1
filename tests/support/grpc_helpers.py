"""Helpers for tests that start real services in-process on loopback."""
from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import Iterator

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from speckv.services import cli
from speckv.services.common.config import parse_config
from speckv.services.common.rpc.server import ServiceServer
from speckv.services.common.rpc.telemetry import Telemetry, build_telemetry

SERVICE_NAMES = {"kvstore": "speckv.v1.KVStore", "predictor": "speckv.v1.Predictor",
                 "scheduler": "speckv.v1.Scheduler"}


def config_class(service: str) -> type:
    from speckv.services.common.rpc.server import ServerSettings

    module = importlib.import_module(cli.SERVER_MODULES[service].rsplit(".", 1)[0] + ".config")
    return next(c for c in vars(module).values()
                if isinstance(c, type) and issubclass(c, ServerSettings) and c is not ServerSettings)


@contextmanager
def running(service: str, argv: list[str] = (), telemetry: Telemetry | None = None) -> Iterator[ServiceServer]:
    """A started server of `service` on 127.0.0.1, port 0, stopped on exit."""
    config = parse_config(config_class(service), ["--port", "0", *argv], {}, prog=service)
    server_module = importlib.import_module(cli.SERVER_MODULES[service])
    server = server_module.build_server(config, telemetry or build_telemetry(service, {}))
    server.start()
    try:
        yield server
    finally:
        server.stop(grace_s=1.0)


def reflected_services(address: str) -> dict[str, list[str]]:
    """Service -> method names, as a stock reflection client sees them."""
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = DescriptorPool(database)
        return {name: [m.name for m in pool.FindServiceByName(name).methods] for name in database.get_services()}
