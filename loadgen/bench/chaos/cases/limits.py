"""Chaos areas `limits` and `decode`: the cheap abuses of the issue (huge
names, prompts, leases, blocks; pins and silent connections that would hold
memory forever; an empty state file, a flood of family names: cases/bounds.py)
and bytes that do not decode, then a bounded fuzz of every
method with mutated requests (docs/limits.md)."""
from __future__ import annotations

import random
import socket
import time
from typing import TYPE_CHECKING, Callable, Iterator

import grpc
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import message_factory

from speckv.loadgen.bench.chaos.common import (
    TIMEOUT,
    block_bytes,
    cluster_state,
    intact,
    nodes,
    put,
    stats,
    wait_until,
)
from speckv.loadgen.bench.chaos.cases import bounds
from speckv.loadgen.bench.chaos.cases.dataplane import RawWriter
from speckv.loadgen.bench.chaos.report import SERVER_FAULTS, Figure, Verdict, code_of, expect_code
from speckv.services.kvstore.checksum import crc32c
from speckv.services.kvstore.dataplane import wire
from speckv.services.kvstore.dataplane.tcp_target import split_address
from speckv.v1 import kvstore_pb2, predictor_pb2, scheduler_pb2

if TYPE_CHECKING:
    from speckv.loadgen.bench.chaos.cli import Context

INVALID = grpc.StatusCode.INVALID_ARGUMENT
MIB_NAME = "f" * (1 << 20)
SEEDED = [7_700_001, 7_700_002]
SERVICES = {"KVStore": ("node-0", kvstore_pb2), "Scheduler": ("scheduler", scheduler_pb2),
            "Predictor": ("predictor", predictor_pb2)}
MIB = 1 << 20


def run(ctx: "Context") -> None:
    _limits(ctx)
    bounds.run(ctx)  # issue 43's findings 4 and 5: one-off processes beside the cluster
    _decode(ctx)
    _fuzz(ctx)


def _limits(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    area = "limits"
    sched, node1 = cluster.scheduler(), cluster.kvstore("node-1")

    def no_new_family() -> Verdict:
        before = cluster_state(sched).num_families
        verdict = expect_code(lambda: sched.Route(scheduler_pb2.RouteRequest(
            request_id="big", block_hashes=[1], prompt_tokens=16, family=MIB_NAME), timeout=TIMEOUT), INVALID)
        after = cluster_state(sched).num_families
        return Verdict(verdict.ok and after == before, f"{verdict.observed}; families {before} -> {after}")

    rec.case(area, "Route with a 1 MiB family name", "INVALID_ARGUMENT; no family kept", no_new_family)
    rec.case(area, "PutBlocks with a 1 MiB family name", "INVALID_ARGUMENT; nothing stored", lambda: expect_code(
        lambda: node1.PutBlocks(iter([kvstore_pb2.PutBlockRequest(block_hash=7_700_100, data=block_bytes(7_700_100),
                                                                  family=MIB_NAME)]), timeout=TIMEOUT), INVALID,
        also=lambda: _absent(node1, [7_700_100])))

    def huge_prompt() -> Verdict:
        before = {n: (s.queued_tokens, s.routes_total) for n, s in nodes(sched).items()}
        verdict = expect_code(lambda: sched.Route(scheduler_pb2.RouteRequest(
            request_id="huge", block_hashes=[2], prompt_tokens=(1 << 32) - 1), timeout=TIMEOUT), INVALID)
        after = {n: (s.queued_tokens, s.routes_total) for n, s in nodes(sched).items()}
        return Verdict(verdict.ok and after == before, f"{verdict.observed}; booked load "
                                                       f"{'unchanged' if after == before else 'CHANGED'}")

    rec.case(area, "Route with prompt_tokens 2^32-1", "INVALID_ARGUMENT; no load booked", huge_prompt)

    def long_lease() -> Verdict:
        before = stats(node1).reserved_pages
        verdict = expect_code(lambda: node1.Reserve(kvstore_pb2.ReserveRequest(
            order_id="o-24h", block_hashes=list(range(7_700_200, 7_700_264)), lease_ms=24 * 3600 * 1000,
            source_node="node-0", family="chaos"), timeout=TIMEOUT), INVALID)
        after = stats(node1).reserved_pages
        return Verdict(verdict.ok and after == before, f"{verdict.observed}; reserved pages {before} -> {after}")

    rec.case(area, "Reserve with a 24 h lease", "INVALID_ARGUMENT; no page reserved", long_lease)
    rec.case(area, "Lookup of 65,537 hashes", "INVALID_ARGUMENT", lambda: expect_code(
        lambda: node1.Lookup(kvstore_pb2.LookupRequest(block_hashes=list(range(1, 65_539))), timeout=TIMEOUT),
        INVALID))

    def oversized() -> Verdict:
        sent: list[int] = []

        def messages() -> Iterator[kvstore_pb2.PutBlockRequest]:
            for i in range(ctx.scale.oversized_blocks):
                sent.append(i)
                yield kvstore_pb2.PutBlockRequest(block_hash=7_700_300 + i, data=bytes(16 * MIB), family="chaos")

        rss = cluster.rss_bytes("node-1")
        verdict = expect_code(lambda: node1.PutBlocks(messages(), timeout=6 * TIMEOUT), INVALID,
                              also=lambda: _absent(node1, [7_700_300]))
        grown = (cluster.rss_bytes("node-1") - rss) / MIB
        rec.figure(area, Figure(f"node RSS growth after {ctx.scale.oversized_blocks} bad 16 MiB blocks", grown, "MiB",
                                "issue: +488 MiB before item 3"))
        return Verdict(verdict.ok, f"{verdict.observed}; refused after {len(sent)} of "
                                   f"{ctx.scale.oversized_blocks} messages were taken from the stream")

    rec.case(area, f"PutBlocks of {ctx.scale.oversized_blocks} blocks of 16 MiB", "INVALID_ARGUMENT at the first; "
             "nothing stored", oversized)

    def pin_lapses() -> Verdict:
        put(node1, SEEDED)
        node1.Pin(kvstore_pb2.PinRequest(block_hashes=SEEDED), timeout=TIMEOUT)
        pinned = stats(node1).pinned_pages
        released = wait_until(lambda: stats(node1).pinned_pages == 0, cluster.spec.pin_lease_s + 5.0)
        return Verdict(pinned >= 2 and released, f"pinned {pinned}, released after the lease: {released}")

    rec.case(area, "a pin never unpinned", f"released after pin_lease_s ({cluster.spec.pin_lease_s} s here)",
             pin_lapses)

    def silent_connection() -> Verdict:
        hashes = [7_700_400, 7_700_401]
        grant = node1.Reserve(kvstore_pb2.ReserveRequest(order_id="o-silent", block_hashes=hashes, lease_ms=60_000,
                                                         source_node="node-0", family="chaos"), timeout=TIMEOUT)
        data = block_bytes(hashes[0]) + block_bytes(hashes[1])
        writer = RawWriter(grant)
        sock = writer.sock
        # The node answers within a few timeouts (a chunk's receive waits one
        # timeout for the rest of its bytes, then one more): wait past that.
        sock.settimeout(3 * cluster.spec.data_read_timeout_s + 5.0)
        try:
            writer.auth(grant.capability, grant.capability_secret)
            sock.sendall(wire.encode_header(wire.header_buffer(), wire.Kind.CHUNK, grant.handle.encode(), 0, len(data),
                                            crc32c(data)))
            sock.sendall(data[: len(data) // 4])  # then silence, inside a 60 s lease
            start = time.monotonic()
            try:
                closed = sock.recv(1) == b""
            except (socket.timeout, ConnectionResetError):
                closed = False
            held_s = time.monotonic() - start
        finally:
            sock.close()
        freed = wait_until(lambda: stats(node1).reserved_pages == 0, 5.0)
        ratio = held_s / cluster.spec.data_read_timeout_s
        return Verdict(closed and freed and held_s < 60.0, f"closed by the node: {closed} after {held_s:.1f} s "
                                                           f"({ratio:.1f} x data_read_timeout_s); pages freed: {freed}")

    rec.case(area, "a data connection that goes silent mid-chunk",
             f"closed by the node (data_read_timeout_s = {cluster.spec.data_read_timeout_s} s here) and its reserved "
             "pages freed, well before the 60 s lease", silent_connection)


def _absent(stub, hashes: list[int]) -> tuple[bool, str]:
    present = stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=hashes), timeout=TIMEOUT).present
    return not any(present), "nothing stored" if not any(present) else "STORED"


def _methods() -> Iterator[tuple[str, pb_descriptor.MethodDescriptor, object]]:
    for service_name, (target, module) in SERVICES.items():
        for method in module.DESCRIPTOR.services_by_name[service_name].methods:
            yield target, method, module


def _callable(channel: grpc.Channel, service: str, method: pb_descriptor.MethodDescriptor,
              timeout: float = TIMEOUT) -> Callable[[list[bytes]], object]:
    """A raw-bytes call of any shape: requests are already serialized."""
    path = f"/speckv.v1.{service}/{method.name}"
    if method.client_streaming:
        call = (channel.stream_stream if method.server_streaming else channel.stream_unary)(path)
        return lambda messages: call(iter(messages), timeout=timeout)
    call = (channel.unary_stream if method.server_streaming else channel.unary_unary)(path)
    return lambda messages: call(messages[0], timeout=timeout)


def _string_field_bytes(method: pb_descriptor.MethodDescriptor) -> bytes | None:
    """A request whose first string field holds invalid UTF-8 (None: no string field)."""
    for f in method.input_type.fields:
        if f.type == pb_descriptor.FieldDescriptor.TYPE_STRING:
            return bytes([(f.number << 3) | 2, 2, 0xC3, 0x28])
    return None


def _decode(ctx: "Context") -> None:
    cluster, rec = ctx.cluster, ctx.recorder
    area = "decode"
    for target, method, _ in _methods():
        service = method.containing_service.name
        # A streaming call whose stream would be admitted waits for more
        # messages; the deserializer answers the first bad one at once.
        call = _callable(cluster.channel(target), service, method)
        rec.case(area, f"{service}.{method.name}: garbled bytes", "INVALID_ARGUMENT, no traceback",
                 lambda call=call: expect_code(lambda: call([b"\xff\xff\xff\xff"]), INVALID))
        bad = _string_field_bytes(method)
        if bad is not None:
            rec.case(area, f"{service}.{method.name}: invalid UTF-8", "INVALID_ARGUMENT, no traceback",
                     lambda call=call, bad=bad: expect_code(lambda: call([bad]), INVALID))


def _sample(message_class: type, rng: random.Random) -> bytes:
    """A request with every scalar field set to something plausible, serialized."""
    message = message_class()
    for f in message.DESCRIPTOR.fields:
        if f.type == pb_descriptor.FieldDescriptor.TYPE_MESSAGE:
            if not f.is_repeated and not f.message_type.GetOptions().map_entry:
                getattr(message, f.name).ParseFromString(
                    _sample(message_factory.GetMessageClass(f.message_type), rng))
            continue
        value = _scalar(f, rng)
        if value is None:
            continue
        if f.is_repeated:
            getattr(message, f.name).extend([value] * rng.randint(1, 3))
        else:
            setattr(message, f.name, value)
    return message.SerializeToString()


def _scalar(f: pb_descriptor.FieldDescriptor, rng: random.Random) -> object:
    t = pb_descriptor.FieldDescriptor
    if f.type == t.TYPE_STRING:
        return rng.choice(["chaos", "node-0", "", "o-00000001", "x" * 300, "/"])
    if f.type == t.TYPE_BYTES:
        return bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 8, 64])))
    if f.type == t.TYPE_BOOL:
        return rng.random() < 0.5
    if f.type in (t.TYPE_DOUBLE, t.TYPE_FLOAT):
        return rng.choice([0.0, 1.0, -1.0, 1e300, float("nan"), float("inf")])
    if f.type == t.TYPE_ENUM:
        return rng.choice([v.number for v in f.enum_type.values])
    if f.type in (t.TYPE_UINT32, t.TYPE_FIXED32):
        return rng.choice([0, 1, 7_700_001, (1 << 32) - 1])
    if f.type in (t.TYPE_UINT64, t.TYPE_FIXED64):
        return rng.choice([0, 1, 7_700_001, (1 << 64) - 1])
    if f.type in (t.TYPE_INT32, t.TYPE_INT64, t.TYPE_SINT32, t.TYPE_SINT64):
        return rng.choice([0, 1, -1])
    return None


def _mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(4)
        if kind == 0 and buf:
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif kind == 1 and buf:
            del buf[rng.randrange(len(buf)):]
        elif kind == 2:
            at = rng.randint(0, len(buf))
            buf[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 8)))
        else:
            buf += bytes([rng.choice([0x08, 0x10, 0x1a, 0x22, 0xff]), 0xff, 0xff, 0xff, 0x0f])
    return bytes(buf)


def _fuzz(ctx: "Context") -> None:
    """Mutated requests as the predictor's identity (a certificate holder that
    is no node and no admin, so a flipped bit cannot make a rightful
    re-registration): every answer is a status of the caller's making, never
    INTERNAL or UNKNOWN; no service dies; stored blocks keep their bytes."""
    cluster, rec = ctx.cluster, ctx.recorder
    node0 = cluster.kvstore("node-0")
    put(node0, SEEDED)
    rng = random.Random(23)
    methods = list(_methods())
    codes: dict[str, int] = {}
    faults: list[str] = []
    for i in range(ctx.scale.fuzz_calls):
        target, method, _ = methods[i % len(methods)]
        if method.name == "ReloadModel":
            continue  # refused to this identity anyway; a probe process per call would only cost time
        service = method.containing_service.name
        request_class = message_factory.GetMessageClass(method.input_type)
        messages = [_mutate(_sample(request_class, rng), rng) for _ in range(rng.randint(1, 3))]
        # An admitted event stream waits for events: a short deadline ends it.
        timeout = 0.3 if method.server_streaming else TIMEOUT
        call = _callable(cluster.channel(target, "predictor"), service, method, timeout)
        code, details = code_of(lambda: call(messages))
        codes[code.name] = codes.get(code.name, 0) + 1
        if code in SERVER_FAULTS:
            faults.append(f"{service}.{method.name}: {code.name} {details[:80]}")

    def verdict() -> Verdict:
        dead = [s.name for s in cluster.services.values() if not s.alive()]
        held, what = intact(node0, SEEDED)
        ok = not faults and not dead and held
        return Verdict(ok, f"codes {dict(sorted(codes.items()))}; faults {faults[:3]}; dead {dead}; {what}")

    rec.case("decode", f"fuzz: {ctx.scale.fuzz_calls} mutated requests over every method",
             "no INTERNAL/UNKNOWN, no service dies, stored blocks byte-identical", verdict)
