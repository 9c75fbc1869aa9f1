"""Property-based request validation (issue 23, item 6): for every RPC of
the kvstore, the scheduler and the predictor, requests with random and
invalid field values, served by the real servicers on loopback, are never
answered INTERNAL or UNKNOWN, never stop the service, never change a stored
block's bytes, and, when refused, change no state at all.

Requests are drawn field by field from each method's protobuf descriptor
(so a new field is fuzzed without touching this file): extreme integers,
NaN and infinities, empty, long and non-ASCII strings, odd bytes, nested
messages. Bounded: a few examples per method, no deadline (the machine is
shared)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import grpc
import pytest
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speckv.services.common.rpc.telemetry import build_telemetry
from speckv.services.predictor.config import PredictorConfig
from speckv.services.predictor.server import build_server as build_predictor
from speckv.v1 import kvstore_pb2, predictor_pb2, predictor_pb2_grpc, scheduler_pb2
from tests.support.kvstore_service import TINY, block_bytes, kvstore, put
from tests.support.scheduler_service import register, scheduler
from tests.support.waiting import TIMEOUT, wait_until

SEEDED = [11, 12, 13]
FAULTS = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
MODULES = {"KVStore": kvstore_pb2, "Scheduler": scheduler_pb2, "Predictor": predictor_pb2}
METHODS = [(service, m) for service, module in MODULES.items()
           for m in module.DESCRIPTOR.services_by_name[service].methods]
F = pb_descriptor.FieldDescriptor
UINT_EDGES = {F.TYPE_UINT32: (1 << 32) - 1, F.TYPE_FIXED32: (1 << 32) - 1, F.TYPE_UINT64: (1 << 64) - 1,
              F.TYPE_FIXED64: (1 << 64) - 1}
SINT_EDGES = {F.TYPE_INT32: 31, F.TYPE_SINT32: 31, F.TYPE_SFIXED32: 31, F.TYPE_INT64: 63, F.TYPE_SINT64: 63,
              F.TYPE_SFIXED64: 63}


def _scalar(field: pb_descriptor.FieldDescriptor) -> st.SearchStrategy:
    if field.type in UINT_EDGES:
        top = UINT_EDGES[field.type]
        return st.one_of(st.sampled_from([0, 1, 11, 12, 13, top]), st.integers(0, top))
    if field.type in SINT_EDGES:
        bits = SINT_EDGES[field.type]
        return st.integers(-(1 << bits), (1 << bits) - 1)
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        width = 64 if field.type == F.TYPE_DOUBLE else 32
        return st.one_of(st.sampled_from([0.0, -1.0, 1e308]), st.floats(width=width))
    if field.type == F.TYPE_BOOL:
        return st.booleans()
    if field.type == F.TYPE_STRING:
        return st.one_of(st.sampled_from(["", "n1", "none", "f", "o-00000001", "x" * 300, "/", "\u00e9\u4e2d"]),
                         st.text(max_size=40))
    if field.type == F.TYPE_BYTES:
        return st.binary(max_size=600)
    if field.type == F.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 1000))
    raise AssertionError(f"no strategy for {field.full_name}")


def message_strategy(desc: pb_descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy:
    """A strategy of messages of desc: each field absent or drawn."""
    parts: dict[str, st.SearchStrategy] = {}
    for field in desc.fields:
        if field.type == F.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
                inner = st.dictionaries(_scalar(key), _scalar(value), max_size=3)
            elif depth >= 2:
                continue
            else:
                inner = message_strategy(field.message_type, depth + 1)
                if field.is_repeated:
                    inner = st.lists(inner, max_size=3)
        else:
            inner = st.lists(_scalar(field), max_size=5) if field.is_repeated else _scalar(field)
        parts[field.name] = st.none() | inner
    message_class = message_factory.GetMessageClass(desc)
    return st.fixed_dictionaries(parts).map(lambda values: _build(message_class, values))


def _build(message_class: type, values: dict[str, object]) -> object:
    message = message_class()
    for name, value in values.items():
        if value is None:
            continue
        field = message.DESCRIPTOR.fields_by_name[name]
        target = getattr(message, name)
        if field.type == F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            target.update(value)
        elif field.type == F.TYPE_MESSAGE and field.is_repeated:
            for item in value:
                target.add().CopyFrom(item)
        elif field.type == F.TYPE_MESSAGE:
            target.CopyFrom(value)
        elif field.is_repeated:
            target.extend(value)
        else:
            setattr(message, name, value)
    return message


class Services:
    """The three servers on loopback, their stubs, and what must not change."""

    def __init__(self, sched_server, sched, kv_server, kv, predictor_server) -> None:
        self.addresses = {"Scheduler": sched_server.address, "KVStore": kv_server.address,
                          "Predictor": predictor_server.address}
        self.sched, self.kv = sched, kv
        self.channel = grpc.insecure_channel(predictor_server.address)
        self.predictor = predictor_pb2_grpc.PredictorStub(self.channel)
        self.channels = {name: grpc.insecure_channel(address) for name, address in self.addresses.items()}

    def snapshot(self) -> dict[str, object]:
        """The state a refused call must leave as it was: what only a call
        changes (not what time changes on its own: reservations and pins
        lapsing, orders of earlier examples failing, families ageing out)."""
        stats = self.kv.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
        state = self.sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
        info = self.predictor.GetModelInfo(predictor_pb2.ModelInfoRequest(), timeout=TIMEOUT)
        return {
            "blocks": [b.data for b in self.kv.GetBlocks(kvstore_pb2.GetBlocksRequest(block_hashes=SEEDED),
                                                         timeout=TIMEOUT)],
            "kvstore": (stats.blocks_stored_total, stats.blocks_committed_total),
            "scheduler": (state.policy, sorted((n.node_id, n.address, n.capacity_pages) for n in state.nodes),
                          sum(c.count for c in state.orders)),
            "predictor": (info.version, info.source, info.observations_total),
        }

    def close(self) -> None:
        for channel in [self.channel, *self.channels.values()]:
            channel.close()


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    with contextlib.ExitStack() as stack:
        sched_server, sched = stack.enter_context(scheduler(confirm_routes=False))
        register(sched, "n1", "127.0.0.1:1", block_size=TINY.block_size)
        register(sched, "n2", "127.0.0.1:2", block_size=TINY.block_size)
        # data_plane_auth on: a Replicate to an address no node registered is refused without a connection.
        kv_server, kv = stack.enter_context(kvstore(node_id="n-prop", scheduler=sched_server.address,
                                                    heartbeat_interval_s=0.2, data_plane_auth="on"))
        assert wait_until(lambda: len(sched.GetClusterState(scheduler_pb2.ClusterStateRequest(),
                                                            timeout=TIMEOUT).nodes) == 3)
        put(kv, *SEEDED)
        predictor_server = build_predictor(PredictorConfig(port=0),
                                           build_telemetry("predictor", {})).start()
        stack.callback(predictor_server.stop, 0.5)
        found = Services(sched_server, sched, kv_server, kv, predictor_server)
        stack.callback(found.close)
        yield found


def _call(services: Services, service: str, method: pb_descriptor.MethodDescriptor,
          messages: list) -> tuple[grpc.StatusCode, str]:
    channel = services.channels[service]
    path = f"/speckv.v1.{service}/{method.name}"
    serialize = type(messages[0]).SerializeToString
    kind = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
            (True, False): channel.stream_unary, (True, True): channel.stream_stream}
    call = kind[(method.client_streaming, method.server_streaming)](path, request_serializer=serialize)
    # An admitted event or order stream waits for more: a short deadline ends it.
    timeout = 0.5 if method.server_streaming else TIMEOUT
    try:
        result = call(iter(messages) if method.client_streaming else messages[0], timeout=timeout)
        if method.server_streaming:
            for _ in result:
                pass
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _alive(services: Services) -> None:
    services.kv.GetStats(kvstore_pb2.StatsRequest(), timeout=TIMEOUT)
    services.sched.GetPolicy(scheduler_pb2.GetPolicyRequest(), timeout=TIMEOUT)
    services.predictor.GetModelInfo(predictor_pb2.ModelInfoRequest(), timeout=TIMEOUT)


# The servers' own threads draw from the global random module (the router's
# tie-breaks) while hypothesis generates; that is theirs, not the strategy's.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
@pytest.mark.parametrize("service,method", METHODS, ids=[f"{s}.{m.name}" for s, m in METHODS])
def test_random_requests_are_never_internal_and_refusals_change_nothing(services, service, method):
    requests = message_strategy(method.input_type)
    messages_strategy = st.lists(requests, min_size=1, max_size=3) if method.client_streaming else \
        requests.map(lambda m: [m])

    @settings(max_examples=12, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(messages=messages_strategy)
    def check(messages: list) -> None:
        before = services.snapshot()
        code, details = _call(services, service, method, messages)
        assert code not in FAULTS, f"{service}.{method.name} answered {code.name}: {details}"
        _alive(services)
        after = services.snapshot()
        assert after["blocks"] == [block_bytes(h) for h in SEEDED], "a stored block's bytes changed"
        if code not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED):
            assert after == before, f"refused with {code.name} ({details}) yet state changed"

    check()
