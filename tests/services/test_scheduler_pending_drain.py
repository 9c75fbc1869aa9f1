"""Through the real Scheduler service on loopback: a node whose only
heartbeats are a kvstore's (no queue figures) is routed to again once the
work routed to it has drained (router.pending_stale_s, services/scheduler/cluster.py).

The tiny profile prices queue and prefill at 0.1 ms per token and 2 ms per
request; the clock is a ManualClock, so every figure below is exact.
"""
from speckv.services.common.clock import ManualClock
from speckv.v1 import scheduler_pb2
from tests.support.scheduler_service import register, scheduler
from tests.support.waiting import TIMEOUT

START = 1000.0


def beat(stub) -> None:
    """kv: a kvstore's beat (free pages only); eng: an engine's, reporting
    5000 queued tokens (500 ms of queue) on every beat."""
    assert stub.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="kv", free_pages=256), timeout=TIMEOUT).known
    assert stub.Heartbeat(scheduler_pb2.HeartbeatRequest(node_id="eng", queued_tokens=5000, num_waiting_requests=0,
                                                         free_pages=256), timeout=TIMEOUT).known


def route(stub, request_id: str, block_hash: int, prompt_tokens: int) -> str:
    return stub.Route(scheduler_pb2.RouteRequest(request_id=request_id, block_hashes=[block_hash],
                                                 prompt_tokens=prompt_tokens), timeout=TIMEOUT).node_id


def queued_tokens(stub, node_id: str) -> int:
    state = stub.GetClusterState(scheduler_pb2.ClusterStateRequest(), timeout=TIMEOUT)
    return next(n.queued_tokens for n in state.nodes if n.node_id == node_id)


def test_a_node_without_queue_reports_is_routed_to_again_once_its_routed_work_drained():
    clock = ManualClock(START)
    with scheduler(clock=clock) as (_server, stub):
        register(stub, "kv", "127.0.0.1:1")  # nothing listens: each Route's Lookup fails fast
        register(stub, "eng", "127.0.0.1:2")
        beat(stub)
        # 10,000 tokens: 1002 ms of prefill; kv (0 ms queued) beats eng (500 ms)
        assert route(stub, "big", 1, 10_000) == "kv"
        assert queued_tokens(stub, "kv") == 10_000
        # kv now looks 1002 ms queued (0.1 x 10,000 + 2): small requests go to eng, whose
        # engine counts them in its next report; kv's beats carry no queue and forget nothing
        for i in range(4):
            assert route(stub, f"small-{i}", 100 + i, 64) == "eng", i
            clock.advance(1.0)
            beat(stub)
        # the beat at START + 3 is not past the stale time (3 s after kv registered): nothing
        # worked off. The one at START + 4 credits 1 s: 1002 - 1000 = 2 ms left, 10,000 x 2/1002
        # -> 20 tokens (rounded up) and 1 request: 0.1 x 20 + 2 = 4 ms < eng's 500 ms
        assert clock.now() == START + 4.0
        assert queued_tokens(stub, "kv") == 20
        assert route(stub, "after", 200, 64) == "kv"
