"""A kvstore publishing its KV events in vLLM's wire format (events out), on
real ZMQ sockets: a plain SUB socket and a DEALER here read what a vLLM
subscriber would, and the scheduler's own `--kv-events` feed (the path built
for vLLM engines, with no speckv event stream) indexes the node and routes
to it."""
from __future__ import annotations

import socket

import msgpack
import zmq

from speckv.services.common.tiers import Tier
from speckv.services.scheduler.adapters.vllm_decode import VllmBatchDecoder, split_frames
from speckv.services.scheduler.holder_index import HolderEventKind
from speckv.v1 import kvstore_pb2, scheduler_pb2
from tests.support.kvstore_service import TINY, kvstore, put
from tests.support.scheduler_service import register, scheduler
from tests.support.vllm_replay import replay
from tests.support.waiting import TIMEOUT, wait_until

TOPIC = b"kv-events"
PROBE_WAIT_MS = 300


def free_endpoint() -> str:
    """A loopback TCP endpoint nobody holds right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def receive(sub: zmq.Socket, wait_ms: int) -> list[tuple[int, bytes]]:
    """Every (sequence, payload) that arrives within wait_ms of the last one."""
    got = []
    while sub.poll(wait_ms):
        frames = sub.recv_multipart()
        assert frames[0] == TOPIC
        got.append(split_frames(frames))
    return got


def stored_hashes(payload: bytes) -> list[list[int]]:
    return [e.block_hashes for e in VllmBatchDecoder(TINY.block_size).decode(0, payload).events
            if e.kind is HolderEventKind.STORED]


def probe_until_subscribed(stub, sub: zmq.Socket, first_hash: int) -> list[tuple[int, bytes]]:
    """A PUB socket sends a subscriber only what it publishes after the
    subscription reaches it, which happens asynchronously: store fresh blocks
    one by one until the batch of the latest one arrives. Returns what arrived,
    ending with that batch."""
    got: list[tuple[int, bytes]] = []
    for i in range(int(TIMEOUT * 1000 / PROBE_WAIT_MS)):
        put(stub, first_hash + i)
        got += receive(sub, PROBE_WAIT_MS)
        if got and stored_hashes(got[-1][1]) == [[first_hash + i]]:
            return got
    raise AssertionError("the SUB socket never received a batch")


def test_a_kvstore_publishes_stores_and_evictions_as_vllm_batches():
    pub_endpoint, replay_endpoint = free_endpoint(), free_endpoint()
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
    try:
        with kvstore(device_pages=4, kv_events_publish=pub_endpoint, kv_events_replay=replay_endpoint,
                     kv_events_topic=TOPIC.decode()) as (_, stub):
            put(stub, 100, 101)  # sequence 0, before anyone listens: only the replay socket has it
            sub.connect(pub_endpoint)
            live = probe_until_subscribed(stub, sub, first_hash=1000)
            last = live[-1][0]

            chain_a, chain_b = (200, 201, 202, 203), (300, 301)
            put(stub, *chain_a)  # the pool holds 4 blocks: all earlier ones go
            put(stub, *chain_b)  # two of chain a go
            present = stub.Lookup(kvstore_pb2.LookupRequest(block_hashes=chain_a), timeout=TIMEOUT).present
            evicted_a = [h for h, hit in zip(chain_a, present) if not hit]
            assert len(evicted_a) == 2
            while live[-1][0] < last + 4:  # REMOVED, STORED of each put
                assert sub.poll(int(TIMEOUT * 1000)), "the kvstore stopped publishing"
                live.append(split_frames(sub.recv_multipart()))

            sequences = [s for s, _ in live]
            assert sequences == list(range(sequences[0], last + 5))  # consecutive, nothing lost
            decoder = VllmBatchDecoder(TINY.block_size)
            batches = [decoder.decode(s, p).events for s, p in live if s > last]
            assert [[(e.kind, e.tier) for e in events] for events in batches] == [
                [(HolderEventKind.REMOVED, Tier.DEVICE)], [(HolderEventKind.STORED, Tier.DEVICE)],
                [(HolderEventKind.REMOVED, Tier.DEVICE)], [(HolderEventKind.STORED, Tier.DEVICE)]]
            assert {100, 101, 1000} <= set(batches[0][0].block_hashes)  # whatever the probes left is gone too
            assert (batches[1][0].block_hashes, batches[1][0].has_parent) == (list(chain_a), False)
            assert sorted(batches[2][0].block_hashes) == evicted_a
            assert batches[3][0].block_hashes == list(chain_b)
            # vLLM's current shape: "type"-tagged maps, medium named, no token ids (speckv keeps none).
            ts, [stored], rank = msgpack.unpackb(live[-1][1])
            assert (stored["type"], stored["medium"], stored["token_ids"], stored["block_size"], rank) == \
                ("BlockStored", "GPU", [], TINY.block_size, 0)

            # What the SUB socket missed, and the rest again, from the replay socket.
            replayed = replay(replay_endpoint, 0)
            assert [s for s, _ in replayed] == list(range(0, last + 5))
            assert stored_hashes(replayed[0][1]) == [[100, 101]]
            assert replayed[sequences[0]:] == live  # byte for byte what was published
    finally:
        sub.close(linger=0)
        context.term()


def test_the_scheduler_indexes_a_publishing_kvstore_and_routes_to_it():
    """The kvstore registers nowhere: the scheduler knows it only from its
    vLLM KV events (--kv-events), as it knows a vLLM engine."""
    pub_endpoint, replay_endpoint = free_endpoint(), free_endpoint()
    with kvstore(node_id="kv-1", kv_events_publish=pub_endpoint, kv_events_replay=replay_endpoint) as (_, kv):
        prefix = [500, 501, 502]
        put(kv, *prefix)  # before the scheduler subscribes: it learns these from the replay socket
        spec = f"kv-1={pub_endpoint},replay={replay_endpoint},address=127.0.0.1:18100"
        with scheduler(engine_profile="tiny", kv_events=spec, heartbeat_interval_ms=200) as (_, sched):
            register(sched, "other", "127.0.0.1:18101", block_size=TINY.block_size)  # holds nothing

            def nodes():
                state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
                return {n.node_id: n for n in state.nodes}

            assert wait_until(lambda: "kv-1" in nodes() and nodes()["kv-1"].alive)
            # The feed catches up once a live batch shows it a sequence: store until one reaches it.
            probes = 0
            while not wait_until(lambda: nodes()["kv-1"].num_blocks > 0, timeout=0.5):
                put(kv, 600 + probes)
                probes += 1
                assert probes < 40, "the scheduler never indexed the kvstore"
            assert wait_until(lambda: nodes()["kv-1"].num_blocks == len(prefix) + probes)

            for node_id in ("kv-1", "other"):  # an engine-side reporter: both queues are empty
                sched.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id=node_id, queued_tokens=0,
                                                               num_waiting_requests=0), timeout=TIMEOUT)
            reply = sched.Route(scheduler_pb2.RouteRequest(request_id="r", block_hashes=prefix,
                                                           prompt_tokens=TINY.block_size * (len(prefix) + 1)),
                                timeout=TIMEOUT)
            assert (reply.node_id, reply.address, reply.cached_blocks) == ("kv-1", "127.0.0.1:18100", len(prefix))
