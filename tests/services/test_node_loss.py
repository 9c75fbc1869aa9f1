"""A scripted three-node loss on real services (issue 27): kvstore processes
registered with a real scheduler, one SIGKILLed.

- The scheduler declares the node down when its event stream closes and the
  immediate reconnect is refused (with the heartbeat timeout a minute, so
  nothing else can be what declared it), or, with that rule off, after its
  heartbeat timeout. Either way routes avoid it, its orders
  fail, the index keeps none of its blocks, and a node that comes back under
  the same id is a new incarnation with no holdings.
- The reference router re-sends a request in flight on a killed node once,
  during decode with the streamed tokens appended to its prompt, and reports
  it failed when its second node dies too (migration limit 1).
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from concurrent import futures
from typing import Iterator

import grpc
import pytest

from speckv.loadgen.bench.transfer.procs import KVStoreProcess, start_kvstore
from speckv.loadgen.engines.driver import LiveEngines, TraceClock
from speckv.loadgen.engines.emulated import EmulatedEngine
from speckv.loadgen.experiments.metrics import RequestRecord
from speckv.loadgen.experiments.reference_router import ReferenceRouter
from speckv.loadgen.experiments.replica_ledger import ReplicaLedger
from speckv.loadgen.workload.replay import TimeMap
from speckv.services.common.traces import TraceRequest
from speckv.v1 import common_pb2, scheduler_pb2
from tests.support.engine_cases import KV_PER_TOKEN, LIMITS, LINK, PROFILE
from tests.support.kvstore_procs import GEOMETRY, put
from tests.support.scheduler_service import scheduler
from tests.support.waiting import TIMEOUT, wait_until

NODES = ("n1", "n2", "n3")
BLOCK = GEOMETRY.block_size
CHAINS = {"n1": [101, 102, 103], "n2": [201, 202, 203], "n3": [301, 302, 303, 304]}


@contextlib.contextmanager
def three_nodes(scheduler_address: str, ids: tuple[str, ...] = NODES) -> Iterator[dict[str, KVStoreProcess]]:
    """Kvstore processes that register with the scheduler, started side by side."""
    args = ["--geometry", "tiny", "--block-size", str(BLOCK), "--scheduler", scheduler_address,
            "--heartbeat-interval-s", "0.2", "--device-pages", "64"]
    # The pool's threads outlive the block: a child dies with the thread that forked it (PR_SET_PDEATHSIG).
    with futures.ThreadPoolExecutor(len(ids)) as pool:
        started = list(pool.map(lambda n: start_kvstore(n, args), ids))
        try:
            yield {p.node_id: p for p in started}
        finally:
            for process in started:
                process.stop(grace_s=2.0)


def nodes(sched) -> dict[str, scheduler_pb2.NodeState]:
    return {n.node_id: n for n in sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT).nodes}


def alive(sched) -> set[str]:
    return {k for k, n in nodes(sched).items() if n.alive}


def order_states(sched) -> dict[int, int]:
    state = sched.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    return {c.state: c.count for c in state.orders}


def route(sched, chain: list[int]) -> scheduler_pb2.RouteResponse:
    return sched.Route(scheduler_pb2.RouteRequest(block_hashes=chain, prompt_tokens=len(chain) * BLOCK + 1,
                                                  family=str(chain[0])), timeout=TIMEOUT)


@pytest.mark.parametrize("rule", [
    pytest.param({"node_timeout_s": 60.0}, id="stream-closed"),  # only the closed stream can declare it
    pytest.param({"node_timeout_s": 5.0, "loss_probe_s": 0.0}, id="heartbeat-timeout"),  # the rule off
])
def test_a_killed_node_is_down_its_orders_fail_and_it_comes_back_empty(rule):
    with scheduler(**rule) as (server, sched), three_nodes(server.address) as procs:
        assert wait_until(lambda: alive(sched) == set(NODES))
        for node, chain in CHAINS.items():
            put(procs[node], chain)
        assert wait_until(lambda: all(nodes(sched)[n].num_blocks == len(c) for n, c in CHAINS.items()))
        assert route(sched, CHAINS["n3"]).node_id == "n3"

        # Frozen, n3's agent takes no order: this one stays ISSUED until n3 dies.
        victim = procs["n3"]
        victim.popen.send_signal(signal.SIGSTOP)
        sched.SubmitOrder(scheduler_pb2.SubmitOrderRequest(order=common_pb2.ReplicationOrder(
            family="301", block_hashes=CHAINS["n3"], source_node="n3", target_node="n1", lease_ms=60_000)),
            timeout=TIMEOUT)
        assert order_states(sched).get(common_pb2.ORDER_STATE_ISSUED) == 1
        victim.kill()

        assert wait_until(lambda: "n3" not in alive(sched))
        assert alive(sched) == {"n1", "n2"}
        # The index keeps none of its blocks (after a timeout, from the sweep of the next tick).
        assert wait_until(lambda: nodes(sched)["n3"].num_blocks == 0)
        assert order_states(sched).get(common_pb2.ORDER_STATE_FAILED) == 1
        assert not order_states(sched).get(common_pb2.ORDER_STATE_ISSUED)
        for _ in range(5):  # nothing goes to it: its prefix is cached nowhere now
            reply = route(sched, CHAINS["n3"])
            assert reply.node_id in ("n1", "n2") and reply.cached_blocks == 0 and not reply.fetch_from_node
        assert route(sched, CHAINS["n1"]).node_id == "n1"  # the survivors' holdings stand

        with three_nodes(server.address, ("n3",)):  # back under the same id: a new incarnation
            assert wait_until(lambda: "n3" in alive(sched))
            assert nodes(sched)["n3"].num_blocks == 0
            assert route(sched, CHAINS["n3"]).cached_blocks == 0


def _request(prompt_blocks: int, output_tokens: int, first_hash: int) -> TraceRequest:
    hashes = tuple(range(first_hash, first_hash + prompt_blocks))
    return TraceRequest(0.0, prompt_blocks * BLOCK + 7, output_tokens, hashes, BLOCK, str(first_hash))


def test_a_request_on_a_dead_node_is_resent_once_then_reported_failed():
    done: list[RequestRecord] = []
    with scheduler(node_timeout_s=60.0) as (server, sched), three_nodes(server.address) as procs:
        assert wait_until(lambda: alive(sched) == set(NODES))
        channels = {n: grpc.insecure_channel(p.address) for n, p in procs.items()}
        scheduler_channel = grpc.insecure_channel(server.address)
        times = TimeMap(time.monotonic(), 0.0, 1.0)
        engines = {n: EmulatedEngine(n, PROFILE, LIMITS, LINK, KV_PER_TOKEN) for n in NODES}
        box: list[ReferenceRouter] = []
        live = LiveEngines(engines, TraceClock(times), scheduler_channel,
                           lambda events: box[0].on_engine_events(events), heartbeat_s=0.2)
        router = ReferenceRouter(scheduler_channel, channels, live, PROFILE, ReplicaLedger(), threading.Lock(),
                                 GEOMETRY.bytes_per_block, KV_PER_TOKEN, on_done=done.append, workers=2)
        box.append(router)
        live.start()
        try:
            request = _request(4, 50_000, 9001)  # decodes for minutes: it is in flight at each kill
            router.send(0, request)
            assert wait_until(lambda: "r0" in router.jobs and router.jobs["r0"].tokens_out >= 2)
            first = router.records[0].node_id
            procs[first].kill()
            counts = router.node_died(first)
            assert (counts.resent, counts.lost) == (1, 0)

            # During decode: re-sent with the streamed tokens appended to its prompt, to a survivor.
            assert wait_until(lambda: router.jobs["r0"].prompt_tokens > request.prompt_tokens)
            job = router.jobs["r0"]
            streamed = job.prompt_tokens - request.prompt_tokens
            assert job.output_tokens == request.output_tokens - streamed
            second = router.records[0].node_id
            assert second != first and not done

            procs[second].kill()
            counts = router.node_died(second)
            assert (counts.resent, counts.lost) == (0, 1)
            assert [r.request_id for r in done] == ["r0"] and "lost" in done[0].error and not done[0].served
            assert router.pending() == 0

            # A request sent now avoids both dead nodes.
            router.send(1, _request(2, 4, 9101))
            assert wait_until(lambda: len(done) == 2)
            assert done[1].served and done[1].node_id not in (first, second)
        finally:
            live.stop()
            router.close()
            scheduler_channel.close()
            for channel in channels.values():
                channel.close()
