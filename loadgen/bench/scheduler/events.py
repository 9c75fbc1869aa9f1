"""What a scheduler replica pays to apply one KV event (issue 46, the event
fan-in of docs/scale.md), on the bench's synthetic cluster (synth.py: 1,000
nodes, 1M blocks, 100k families).

The events are a seeded stream shaped like the simulator's 1,024-node run of
the Mooncake trace (docs/journal/scale.md): per put on a node, a device
STORED of a fresh 19-block chain, its host copy (STORED, medium CPU) four
times in five, the node's oldest device chain REMOVED (demoted, or dropped
when it has no host copy) six times in seven, its oldest host chain REMOVED
three times in eight: about 3 events of 19 blocks per put, the trace's mix
(954k events over 312k puts, 4.95 per Route of the fleet).
Each node's events carry consecutive sequences, as a kvstore's stream does.

Two paths, each timed as CPU time over the whole stream (gc frozen):
  stream: each event as the KVEvent proto a kvstore sends, through the
          stream thread's `NodeEventStream.take` into the core (what the live
          replica runs per message, less gRPC's own receive);
  core:   `SchedulerCore.apply_kv_events` of the already-decoded events
          (what the simulator measured).
Then it routes 5,000 requests and prints a digest of the decisions, the index
and the reuse history, which must not change with the apply's code.

    python -m speckv.loadgen.bench.scheduler.events [stream|core] [PUTS] [--json PATH]
"""
from __future__ import annotations

import gc
import hashlib
import json
import sys
import time
from collections import deque

import numpy as np

from speckv.loadgen.bench.scheduler.synth import PROFILE, SyntheticCluster, SynthShape
from speckv.services.common.clock import ManualClock
from speckv.services.common.engine_profile import get_profile
from speckv.services.common.ids import NodeId
from speckv.services.scheduler.adapters.event_sync import NodeEventStream, to_index_event
from speckv.services.scheduler.core import SchedulerCore
from speckv.services.scheduler.ports import SchedulerSettings
from speckv.v1 import kvstore_pb2

CHAIN_BLOCKS = 19
HOST_COPY_P, DEVICE_REMOVE_P, HOST_REMOVE_P = 0.8, 6 / 7, 3 / 8


def event_stream(cluster: SyntheticCluster, puts: int, seed: int = 1) -> list[tuple[NodeId, kvstore_pb2.KVEvent]]:
    """(node, KVEvent) in arrival order; see the module docstring."""
    rng = np.random.default_rng(seed)
    nodes = rng.integers(0, len(cluster.node_ids), size=puts).tolist()
    draws = rng.random((puts, 3)).tolist()
    fresh = rng.integers(1 << 62, 1 << 63, size=(puts, CHAIN_BLOCKS)).tolist()
    device: dict[NodeId, deque[list[int]]] = {}
    host: dict[NodeId, deque[list[int]]] = {}
    sequence: dict[NodeId, int] = {}
    out: list[tuple[NodeId, kvstore_pb2.KVEvent]] = []

    def emit(node: NodeId, kind: int, hashes: list[int], medium: str, family: str = "") -> None:
        sequence[node] = sequence.get(node, 0) + 1
        out.append((node, kvstore_pb2.KVEvent(sequence=sequence[node], type=kind, block_hashes=hashes,
                                              family=family, node_id=node, medium=medium)))

    for i, (n, (p_host, p_dev, p_hrm), chain) in enumerate(zip(nodes, draws, fresh)):
        node = cluster.node_ids[n]
        emit(node, kvstore_pb2.KV_EVENT_TYPE_STORED, chain, "GPU", f"put{i % 5000}")
        device.setdefault(node, deque()).append(chain)
        if p_host < HOST_COPY_P:
            emit(node, kvstore_pb2.KV_EVENT_TYPE_STORED, chain, "CPU")
            host.setdefault(node, deque()).append(chain)
        if p_dev < DEVICE_REMOVE_P and len(device[node]) > 1:
            emit(node, kvstore_pb2.KV_EVENT_TYPE_REMOVED, device[node].popleft(), "GPU")
        if p_hrm < HOST_REMOVE_P and len(host.get(node, ())) > 1:
            emit(node, kvstore_pb2.KV_EVENT_TYPE_REMOVED, host[node].popleft(), "CPU")
    return out


def run(path: str, puts: int) -> dict[str, object]:
    cluster = SyntheticCluster(SynthShape())
    clock = ManualClock(1000.0)
    core = SchedulerCore(SchedulerSettings(node_timeout_s=3600.0, heartbeat_interval_ms=1000), clock,
                         get_profile(PROFILE))
    cluster.populate(core)
    events = event_stream(cluster, puts)
    blocks = sum(len(e.block_hashes) for _, e in events)
    gc.collect()
    gc.freeze()
    if path == "stream":
        streams = {node: NodeEventStream(node, "unused:1", core.generation(node), core.apply_kv_event,
                                         core.reset_inventory, None) for node in cluster.node_ids}
        take = {node: s._take for node, s in streams.items()}  # the stream thread's step per message
        start = time.process_time_ns()
        for node, message in events:
            if not take[node](message):
                raise RuntimeError(f"event {message.sequence} of {node} was refused")
        cpu_ns = time.process_time_ns() - start
    elif path == "core":
        decoded = [(node, [to_index_event(message)]) for node, message in events]
        start = time.process_time_ns()
        for node, one in decoded:
            core.apply_kv_events(node, core.generation(node), one)  # type: ignore[arg-type]
        cpu_ns = time.process_time_ns() - start
    else:
        raise SystemExit(f"unknown path {path!r}: stream or core")
    return {"path": path, "events": len(events), "blocks": blocks, "cpu_s": cpu_ns / 1e9,
            "us_per_event": cpu_ns / 1e3 / len(events), "us_per_block": cpu_ns / 1e3 / blocks,
            "compiled": not str(sys.modules[SchedulerCore.__module__].__file__).endswith(".py"),
            "digest": decisions_digest(core, cluster)}


def decisions_digest(core: SchedulerCore, cluster: SyntheticCluster, n_routes: int = 5000) -> str:
    """sha256 (16 hex) of 5,000 routes' decisions (node, cached, pull source
    and blocks, promoted blocks, expected TTFT), then of the index and the
    reuse history they leave."""
    h = hashlib.sha256()
    for r in cluster.requests(n_routes):
        res = core.route(r.request_id, r.block_hashes, r.prompt_tokens, r.family)
        h.update(repr((res.node_id, res.cached_blocks, res.fetch_from, res.fetch_blocks, res.promote_blocks,
                       res.expected_ttft_ms)).encode())
    index = core._index  # the bench's own look inside: the state the events left
    for node in cluster.node_ids:
        h.update(repr((node, sorted(index._inventory.get(node, ())), sorted(index._host.get(node, ())),
                       sorted(index._host_only.get(node, ())))).encode())
    h.update(repr(sorted(index._family_root.items())).encode())
    h.update(repr(list(core._reuse._ghosts.items())).encode())
    return h.hexdigest()[:16]


def main(argv: list[str]) -> int:
    json_path = None
    if "--json" in argv:
        at = argv.index("--json")
        json_path, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    path = argv[0] if argv else "stream"
    puts = int(argv[1]) if len(argv) > 1 else 20_000
    result = run(path, puts)
    print(json.dumps(result))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
