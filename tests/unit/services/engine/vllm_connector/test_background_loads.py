"""BackgroundLoads: each request reported once, after all of its loads end,
failed when any failed; a load that raises is a failure, not a lost request."""
import threading

from speckv.services.engine.vllm_connector.background_loads import BackgroundLoads
from speckv.services.engine.vllm_connector.plan import LoadSpec


def wait_idle(loads: BackgroundLoads) -> None:
    for _ in range(400):
        if loads.in_flight() == 0:
            return
        threading.Event().wait(0.025)
    raise AssertionError("loads still in flight")


def spec(req: str, page: int) -> LoadSpec:
    return LoadSpec(req, (page,), (page + 100,))


def test_a_request_is_reported_once_after_all_its_loads_and_failed_if_any_failed():
    gate = threading.Event()

    def load(s: LoadSpec) -> bool:
        gate.wait(10)
        if s.page_ids == (3,):
            raise RuntimeError("boom")
        return s.page_ids != (2,)

    loads = BackgroundLoads(load)
    loads.start([spec("a", 1), spec("b", 2), spec("b", 4), spec("c", 3)])
    assert loads.take_finished() == (set(), set()) and loads.in_flight() == 3
    gate.set()
    wait_idle(loads)
    loads.shutdown()
    assert loads.take_finished() == ({"a", "b", "c"}, {"b", "c"})
    assert loads.take_finished() == (set(), set()) and loads.in_flight() == 0


def test_a_slow_pull_does_not_hold_the_nodes_own_loads():
    peer_answers = threading.Event()

    def load(s: LoadSpec) -> bool:
        if s.source:  # a pull: the peer is slow to copy
            return peer_answers.wait(10)
        return True

    loads = BackgroundLoads(load)
    loads.start([LoadSpec("p", (1,), (101,), source="node-2"), spec("a", 2)])
    deadline = threading.Event()
    for _ in range(200):  # the local load ends while the pull still waits for its peer
        finished, _ = loads.take_finished()
        if "a" in finished:
            break
        deadline.wait(0.05)
    else:
        raise AssertionError("the local load waited for the pull")
    assert loads.in_flight() == 1
    peer_answers.set()
    wait_idle(loads)
    loads.shutdown()
    assert loads.take_finished() == ({"p"}, set())


def test_shutdown_drops_the_queued_loads_and_ends_after_the_running_one():
    running, release = threading.Event(), threading.Event()
    ran = []

    def load(s: LoadSpec) -> bool:
        ran.append(s.req_id)
        running.set()
        return release.wait(10)

    loads = BackgroundLoads(load)
    loads.start([spec("a", 1), spec("b", 2), spec("c", 3)])
    assert running.wait(10)
    threading.Timer(0.2, release.set).start()
    loads.shutdown()  # the engine is stopping: b and c are not run
    assert ran == ["a"]
